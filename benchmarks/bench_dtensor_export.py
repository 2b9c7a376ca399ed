"""How much of each corpus strategy DTensor expresses: the DTensor export of every real model of
``sbplab.models.corpus`` under the hand-written presets and the strategy ``sl.search`` picks on 8 x H100.

Per model and strategy: the export's mode, the share of the step's ATen ops (forward and backward) that
DTensor's own sharding propagation runs exactly as sbplab does (``export.coverage``), the share once the
inputs are redistributed to sbplab's layout, the ops only ``local_map`` can run, the ops the export runs
inside its ``local_map`` calls (attention, and whole modules: RNNs, MoE experts, convolutions), the
``local_map``-only ops it leaves unexpressed, the share it expresses (every op but those: DTensor runs
the rest by its own rules, the ``redistribute`` ones with DTensor's own communication), the share it
runs exactly as sbplab does (by propagation, by the redistributes it adds where a module's input enters:
``exp.module_inputs``, and inside its ``local_map`` calls), its module hooks, and, with ``--train``, whether the exported model trains on Gloo ranks with losses equal
to single-device torch (3 steps of SGD).

    .venv/bin/python benchmarks/bench_dtensor_export.py [--models gpt2,llama] [--strategies dp,tp] [--no-search] [--train]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

import sbplab as sl
from sbplab.export import to_dtensor
from sbplab.export.coverage import as_sbplab, coverage, wrapped_by
from sbplab.models import corpus

STRATEGIES = ("dp", "zero3", "tp", "dp_tp", "pipeline")


def _compile(name: str, strategy: str):
    built = corpus.build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if strategy == "searched":
            hw = sl.Hardware.h100_node()
            res = sl.search(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target, devices=8,
                            hardware=hw, method="auto", time_budget=60)
            st = res.strategy
            return built, sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                                     optimizer=sl.SGD(lr=0.1), strategy=st, hardware=hw), st.name
        st = corpus.strategies()[strategy]()
        return built, sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                                 optimizer=sl.SGD(lr=0.1), strategy=st), st.name


def _train(rank: int, world: int, port: int, exp, name: str, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        b = corpus.build(name)
        model = b.model
        if hasattr(model, "config"):
            model.config.use_cache = False  # a training step: no KV cache (DTensor cannot cat into an empty one)
        mesh = init_device_mesh("cpu", exp.mesh_shape, mesh_dim_names=exp.mesh_dim_names)
        model = exp.apply(model, mesh)
        names = list(exp.input_placements)
        feeds = dict(b.inputs) if isinstance(b.inputs, dict) else dict(zip(names, b.feeds()))
        batch = exp.shard_batch(feeds, mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            with exp.running():
                if isinstance(b.inputs, dict):
                    loss = model(**batch).loss
                else:
                    args = [batch[n] for n in names]
                    out = model(*args[: len(b.inputs)])
                    loss = b.loss_fn(out, args[-1]) if b.loss_fn is not None else out[1]
                loss.backward()
            opt.step()
            v = (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()
            if exp.mode == "fully_shard":
                dist.all_reduce(v)
                v /= world
            losses.append(v.item())
        queue.put((rank, losses))
    except Exception as e:  # noqa: BLE001 (the table says what failed)
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        queue.put((rank, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]} "
                         f"({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"))
    finally:
        dist.destroy_process_group()
    queue.close()
    queue.join_thread()
    os._exit(0)


def _trains(built, exp, name: str) -> str:
    import torch.multiprocessing as mp

    from sbplab.runtime.cluster import free_port

    if exp.mode == "pipeline":
        return "no (pipeline)"
    ref, _ = built.train_torch(3, lambda ps: torch.optim.SGD(ps, lr=0.1))
    world = 1
    for n in exp.mesh_shape:
        world *= n
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_train, args=(r, world, port, exp, name, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    bad = [v for v in got.values() if isinstance(v, str)]
    if bad:
        return f"failed: {bad[0]}"
    diff = max(abs(a - b) for v in got.values() for a, b in zip(v, ref))
    return f"yes, {diff:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default=",".join(corpus.MODELS))
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--no-search", action="store_true", help="leave out the strategy sl.search picks on 8 x H100")
    ap.add_argument("--train", action="store_true", help="also train each export on Gloo ranks (slow)")
    args = ap.parse_args()
    names = args.strategies.split(",") + ([] if args.no_search else ["searched"])
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus")
    print("| model | strategy | DTensor mode | ATen ops | by propagation | with redistributes | local_map only "
          "| ops in the export's local_maps | not expressed | expressed by the export | as sbplab in the export "
          "| module hooks | check s |"
          + (" trains (max loss diff) |" if args.train else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.train else ""))
    for model in args.models.split(","):
        for strategy in names:
            try:
                built, step, label = _compile(model, strategy)
                exp = to_dtensor(step)
                t0 = time.perf_counter()
                cov = coverage(step)
                dt = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 (the table says what failed)
                print(f"| {model} | {strategy} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} |", flush=True)
                continue
            k = cov.kinds
            wrapped, left = wrapped_by(cov, exp)
            exact = as_sbplab(cov, exp)
            hooks = (f"{len(exp.module_inputs)} input, {len(exp.module_outputs)} output, "
                     f"{len(exp.module_maps)} local_map")
            row = (f"| {model} | {label if strategy == 'searched' else strategy} | {exp.mode} | {cov.total} | "
                   f"{cov.fraction:.1%} | {cov.fraction_with_redistributes:.1%} | {k['local_map']} | "
                   f"{wrapped} | {left} | {1 - left / cov.total:.1%} | {exact:.1%} | {hooks} | {dt:.1f} |")
            if args.train:
                row += f" {_trains(built, exp, model)} |"
            print(row, flush=True)


if __name__ == "__main__":
    sys.exit(main())
