"""Compile time of a 24-layer GPT (width 1024) training step on a 2x4 mesh (DP x TP, Adam).

Prints the op counts, the time of each compiler pass (trace, autodiff + optimizer, deduction,
lowering, actor plan), wall-clock and this process's CPU time (on a shared machine the wall clock also
counts other processes' turns; the load average is printed beside them), and the memory: the
per-device peak the compiled step needs, and the compiler process's peak resident memory. The memory
view (a simulated run's register lifetimes) is timed apart and not counted in nn.Module to actor plan:
``sl.compile`` does not make it, ``step.memory`` and ``step.summary()`` do on first access. So are the
imports a process's first capture makes (torch.export, AOTAutograd: ``import_capture_machinery``, made
before the clock, once per process like importing torch). The model is built on the meta device:
compiling needs shapes, not weights, so no 1.2 GB of parameters are allocated. Goals: nn.Module to
actor plan under 2 s for transformers' GPT-2 24 x 1024 (seq 1024) on 2x4, under 3 s for a 32-layer
Llama; measured on a shared 2-core machine at a load of 1.8-2.1, five fresh processes each (median and
range of CPU s): GPT-2 1.40 (1.38-1.50), Llama 2.21 (2.03-2.41), of which capture + deduction 0.99 and
1.43; the tree before the middle layers were copied as converted ops (``layer_copy``), the joint graph
module made lazy and the signature listing lightened, run in turn: 1.76 and 2.67, capture + deduction
1.15 and 1.66 (its actor plan slower too, by that pass's own change since; README has each pass).

    .venv/bin/python benchmarks/bench_compile.py [--layers 24] [--width 1024] [--mesh 2x4]
    .venv/bin/python benchmarks/bench_compile.py --hf gpt2   # transformers' own model, captured at ATen level
    .venv/bin/python benchmarks/bench_compile.py --hf llama --layers 32 --width 4096 --heads 32 --vocab 32000
    .venv/bin/python benchmarks/bench_compile.py --hf gpt2 --compare   # identical layers once vs every layer

With ``--hf``, the first pass is the ATen capture (torch's autograd on fake tensors, traced straight from
the module as ``aten_direct`` does, then the optimizer) of a transformers model built from its config on
the meta device, as ``sl.compile`` captures it (the cross entropy on vocabulary shards where the strategy
splits the vocabulary); a stack of identical layers is captured from its first two layers and copied
(``layer_pair``, else three: ``layer_repeat``), and deduction ranks each op of a repeated layer once,
its twins in later layers taking that ranking (``deduction/layers.py``). ``--whole`` captures every
layer and ranks every op. ``--compare`` runs both, each in a fresh process, and prints their passes side
by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time

import torch

from sbplab.compiler import Adam, add_backward, deduce, from_torch, lower, presets
from sbplab.compiler.deduction.layers import every_layer_ranked
from sbplab.compiler.frontend.vocab_cross_entropy import sharded_loss, splits_vocabulary
from sbplab.compiler.lowering.to_actors import lower_to_actors
from sbplab.compiler.physical.memory import memory_report
from sbplab.compiler.training.training_graph import aten_training_graph
from sbplab.models import GPT, GPTConfig

MEMORY = "memory view (step.memory, on first access)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--mesh", default="2x4", help="dp x tp")
    ap.add_argument("--hf", choices=("gpt2", "llama"), help="a transformers model, captured at ATen level")
    ap.add_argument("--whole", action="store_true",
                    help="capture every layer and rank every op (no identical-layer shortcuts)")
    ap.add_argument("--compare", action="store_true", help="identical layers once vs every layer, side by side")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compare:
        _compare()
        return
    dp, tp = (int(x) for x in args.mesh.split("x"))
    cfg = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                    n_embd=args.width)
    with torch.device("meta"):
        model = GPT(cfg)
    idx = torch.zeros(args.batch, args.seq, dtype=torch.int64)
    strategy = presets.dp_tp((dp, tp))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # torch, sbplab, the meta model

    times: dict[str, float] = {}
    cpu: dict[str, float] = {}
    clock = [time.perf_counter(), time.process_time()]

    def done(name: str) -> None:
        now = [time.perf_counter(), time.process_time()]
        times[name], cpu[name] = now[0] - clock[0], now[1] - clock[1]
        clock[:] = now

    if args.hf:
        model = _hf_model(args)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    imports = 0.0
    if args.hf:  # once per process, as importing torch: timed apart (see import_capture_machinery)
        from sbplab.compiler.frontend.aten_capture import import_capture_machinery

        c = time.process_time()
        import_capture_machinery()
        imports = time.process_time() - c
    t0, c0 = clock = [time.perf_counter(), time.process_time()]
    if args.hf:
        from sbplab.compiler.frontend.layer_repeat import whole_capture

        with torch.device("meta"):
            ids = torch.zeros(args.batch, args.seq, dtype=torch.int64)
        # as sl.compile captures it: the cross entropy written for vocabulary shards where the strategy splits it
        with whole_capture() if args.whole else contextlib.nullcontext(), sharded_loss(splits_vocabulary(strategy)):
            graph = aten_training_graph(model, {"input_ids": ids, "labels": ids}, None, None, 1, Adam(lr=1e-4))
        done("ATen capture (joint graph, layers once) + optimizer")
    else:
        graph = from_torch(model, (idx,), GPT.loss_fn, idx)
        done("trace (torch.fx -> logical graph)")
        add_backward(graph)
        Adam(lr=1e-4).build(graph)
        done("autodiff + optimizer")
    with every_layer_ranked() if args.whole else contextlib.nullcontext():
        d = deduce(graph, strategy)
    done("SBP deduction")
    phys = lower(d)
    done("lowering (physical graph)")
    plan = lower_to_actors(phys, graph)
    done("actor plan (registers, comm order)")
    total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    mem = memory_report(d, phys)  # what step.memory computes on first access, not part of compiling
    done(MEMORY)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB (memory view included)

    if args.json:
        print(json.dumps({"times": times, "cpu": cpu, "total": total, "total_cpu": total_cpu, "rss": rss, "imports": imports,
                          "ops": len(graph.ops), "instances": len(phys.nodes), "load": os.getloadavg()[0]}))
        return
    n = {ph: len(graph.ops_in(ph)) for ph in ("forward", "backward", "update")}
    print(f"{args.hf or 'GPT'} {args.layers} layers, width {args.width}, {args.heads} heads, vocab {args.vocab}, "
          f"seq {args.seq}, batch {args.batch}; Adam; DP x TP on a {dp}x{tp} mesh")
    print(f"logical ops: {len(graph.ops)} ({n['forward']} forward, {n['backward']} backward, {n['update']} update), "
          f"{len(graph.params)} params, {len(graph.tensors)} tensors")
    print(f"boxings: {len(d.boxings)}; physical op instances: {len(phys.nodes)}; collectives: {len(phys.collectives)}")
    print(f"  {'pass':48s} {'wall':>8s}    {'cpu':>8s}     (load average {os.getloadavg()[0]:.2f})")
    for k, v in times.items():
        print(f"  {k:48s} {v * 1e3:8.1f} ms {cpu[k] * 1e3:8.1f} ms")
    core = sum(v for k, v in times.items() if k != MEMORY and not k.startswith(("trace", "autodiff", "ATen")))
    print(f"  {'nn.Module to actor plan':48s} {total * 1e3:8.1f} ms {total_cpu * 1e3:8.1f} ms   (the memory view "
          f"is not in it)")
    if args.hf:
        print(f"  (before the clock: torch.export and AOTAutograd imported, once per process: {imports:.2f} s cpu)")
    print(f"deduce + lower + actor plan: {core:.2f} s; nn.Module to actor plan {total:.2f} s "
          f"(goals: GPT-2 24 layers < 2 s, Llama 32 layers < 3 s); "
          f"{sum(len(rp.actors) for rp in plan.ranks.values())} actors")
    peak = max(m.peak for m in mem.ranks.values())
    print(f"per-device peak memory of the step: {peak / 2**30:.2f} GiB (params "
          f"{mem.ranks[0].params / 2**30:.2f}, optimizer state {mem.ranks[0].optimizer_state / 2**30:.2f}, "
          f"activations {mem.ranks[0].activations_peak / 2**30:.2f} GiB on rank 0)")
    print(f"compiler process peak RSS (torch included): {rss / 2**20:.0f} MiB; before compiling (torch, sbplab "
          f"and the meta-device model imported and built): {rss_before / 2**20:.0f} MiB")


def _compare() -> None:
    """This benchmark's arguments run twice, each in a fresh process: identical layers captured once,
    then every layer; passes side by side (CPU seconds of this process, wall clock in brackets)."""
    argv = [a for a in sys.argv[1:] if a != "--compare"]
    runs = {}
    for route, extra in (("layers once", []), ("every layer", ["--whole"])):
        p = subprocess.run([sys.executable, __file__, *argv, *extra, "--json"], capture_output=True, text=True)
        if p.returncode:
            print(f"{route}: failed: {p.stderr.strip().splitlines()[-1][:200]}")
            return
        runs[route] = json.loads(p.stdout.strip().splitlines()[-1])
    a, b = runs["layers once"], runs["every layer"]
    print(f"{' '.join(argv)}: cpu s (wall s); load average {a['load']:.1f} / {b['load']:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"  {'pass':48s} {'layers once':>18s} {'every layer':>18s}")
    for k in a["times"]:
        if k == MEMORY:
            continue
        print(f"  {k:48s} {a['cpu'][k]:8.2f} ({a['times'][k]:6.2f}) {b['cpu'][k]:8.2f} ({b['times'][k]:6.2f})")
    print(f"  {'nn.Module to actor plan':48s} {a['total_cpu']:8.2f} ({a['total']:6.2f}) "
          f"{b['total_cpu']:8.2f} ({b['total']:6.2f})")
    print(f"  {MEMORY:48s} {a['cpu'][MEMORY]:8.2f} ({a['times'][MEMORY]:6.2f}) "
          f"{b['cpu'][MEMORY]:8.2f} ({b['times'][MEMORY]:6.2f})")
    print(f"  logical ops {a['ops']} / {b['ops']}; physical op instances {a['instances']} / {b['instances']}; "
          f"peak RSS {a['rss'] / 2**20:.0f} / {b['rss'] / 2**20:.0f} MiB")


def _hf_model(args: argparse.Namespace) -> torch.nn.Module:
    """A transformers GPT-2 or Llama of these sizes on the meta device (no weights allocated)."""
    import transformers as tf

    if args.hf == "gpt2":
        cfg = tf.GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads, vocab_size=args.vocab,
                            n_positions=args.seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cls = tf.GPT2LMHeadModel
    else:
        cfg = tf.LlamaConfig(num_hidden_layers=args.layers, hidden_size=args.width, intermediate_size=4 * args.width,
                             num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 4),
                             vocab_size=args.vocab, max_position_embeddings=args.seq)
        cls = tf.LlamaForCausalLM
    with torch.device("meta"):
        return cls(cfg).train()


if __name__ == "__main__":
    main()
