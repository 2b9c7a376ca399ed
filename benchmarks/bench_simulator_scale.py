"""How long the simulator takes on a 24-layer GPT training step as devices grow (compile time apart).

    .venv/bin/python benchmarks/bench_simulator_scale.py [--layers 24] [--max-devices 64]

Prints, per device count and strategy: actors (all ranks), micro-batches, firings of all ranks, rank
classes actually simulated (ranks alike are simulated once), compile seconds (compile and lowering),
simulation seconds (``simulate_plan``, the trace not built) and peak Python memory of the simulation
(tracemalloc, a second run), with the predicted step time on H100 spec-sheet figures.
"""

from __future__ import annotations

import argparse
import pickle
import time
import tracemalloc
from pathlib import Path

import torch

import sbplab as sl
from sbplab.compiler import presets
from sbplab.models import GPT, GPTConfig
from sbplab.sim.predict import plan_of, simulate_plan


def strategies(n: int, micro: int):
    """Data x tensor x pipeline strategies for ``n`` devices."""
    if n == 1:
        return [("single", presets.data_parallel(1))]
    if n == 8:
        return [("dp_tp 2x4", presets.dp_tp((2, 4))),
                ("pipeline 2 x dp_tp 2x2", presets.pipeline(2, micro, (2, 2), inner="dp_tp"))]
    if n == 64:
        return [("dp_tp 8x8", presets.dp_tp((8, 8))),
                ("pipeline 4 x dp_tp 4x4", presets.pipeline(4, micro, (4, 4), inner="dp_tp"))]
    if n == 512:
        return [("pipeline 8 x dp_tp 8x8", presets.pipeline(8, micro, (8, 8), inner="dp_tp"))]
    raise ValueError(f"no strategies for {n} devices; pick 1, 8, 64 or 512")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--max-devices", type=int, default=64)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--cache", default="", help="folder to keep lowered plans in (compiling 64 ranks takes minutes)")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=32, n_layer=args.layers, n_head=8, n_embd=128)
    model = GPT(cfg)
    hw = sl.Hardware.h100_node()
    print(f"GPT {args.layers} layers, n_embd {cfg.n_embd}; simulated on {hw.name}, 3 steps")
    print(f"{'devices':>7} {'strategy':26s} {'actors':>7} {'M':>3} {'firings':>8} {'classes':>7} "
          f"{'compile s':>9} {'sim s':>6} {'sim MB':>7} {'step ms':>8}")
    for n in (1, 8, 64, 512):
        if n > args.max_devices:
            break
        for label, st in strategies(n, args.micro):
            (x,), y = model.example_batch(max(16, 2 * n))
            t0 = time.perf_counter()
            cached = Path(args.cache) / f"gpt{args.layers}-{n}-{label.replace(' ', '_')}.pkl" if args.cache else None
            if cached is not None and cached.exists():
                plan, batch, comm = pickle.loads(cached.read_bytes())
            else:
                c = sl.compile(model, (x,), loss_fn=GPT.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=st)
                plan, batch, comm = plan_of(c)
                if cached is not None:
                    cached.write_bytes(pickle.dumps((plan, batch, comm)))
            t1 = time.perf_counter()
            pred = simulate_plan(plan, hw, steps=3, batch=batch, comm=comm)
            t2 = time.perf_counter()
            tracemalloc.start()  # a second run for memory: tracing allocations slows Python down
            simulate_plan(plan, hw, steps=3, batch=batch, comm=comm)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            actors = sum(len(rp.actors) for rp in plan.ranks.values())
            firings = sum(len(pred.classes[pred.firings.rank[j]]) for j in range(len(pred.firings)))
            print(f"{n:>7} {label:26s} {actors:>7} {plan.micro_batches:>3} {firings:>8} {len(pred.classes):>7} "
                  f"{t1 - t0:>9.1f} {t2 - t1:>6.2f} {peak / 2**20:>7.0f} {pred.step_time * 1e3:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
