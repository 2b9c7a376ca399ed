"""What does the runtime cost per actor firing? (goal: < 50 us median, empty kernels)

A chain of actors with empty kernels runs many micro-batches on one worker, so the compute lane
is never idle; the median time from one firing's start to the next is the scheduler's cost per
firing (register bookkeeping, acks, picking the next ready actor, recording the trace). Printed
beside it: a plain Python loop calling the same empty kernel, measured in this run. Runs unfused
(``fuse=False``: every actor fires on its own), then fused (the whole chain is one actor firing its
parts back to back, ``runtime/fusion.py``), whose start-to-start per part is printed too.

    .venv/bin/python benchmarks/bench_runtime_overhead.py
"""

from __future__ import annotations

import statistics
import time

import torch

from sbplab.runtime import ActorPlan, Compute, LocalCluster, State
from sbplab.runtime.kernels import noop

CHAIN, MICRO, STEPS = 8, 64, 4


def chain_plan() -> ActorPlan:
    acts = [State("x", init=torch.zeros(4))]
    prev = "x"
    for i in range(CHAIN):
        acts.append(Compute(f"c{i}", op="sbplab.runtime.kernels:noop", inputs=(prev,), registers=2))
        prev = f"c{i}"
    return ActorPlan.build(1, {0: acts}, micro_batches=MICRO, name="empty-chain")


def main() -> None:
    plan = chain_plan()
    with LocalCluster(1) as cluster:
        cluster.run(plan, steps=1, progress=False)  # warm-up
        res = cluster.run(plan, steps=STEPS, progress=False, fuse=False)
        fused = cluster.run(plan, steps=STEPS, progress=False)
    ev = sorted(res.trace.select(rank=0, lane="compute"), key=lambda e: e.start)
    gaps = [b.start - a.start for a, b in zip(ev, ev[1:])]
    inside = [e.dur for e in ev]
    firings = len(ev)
    x = [torch.zeros(4)]
    t = time.perf_counter()
    for _ in range(firings):
        noop(x, {})
    direct = (time.perf_counter() - t) / firings * 1e6
    med = statistics.median(gaps)
    print(f"firings: {firings} ({CHAIN} actors x {MICRO} micro-batches x {STEPS} steps, + state)")
    print(f"runtime, median start-to-start per firing: {med:8.1f} us   (goal < 50 us: "
          f"{'met' if med < 50 else 'NOT met'})")
    print(f"runtime, p90 start-to-start per firing:    {sorted(gaps)[int(0.9 * len(gaps))]:8.1f} us")
    print(f"runtime, median time inside a firing:      {statistics.median(inside):8.1f} us")
    print(f"run wall time per firing (incl. setup):    {res.wall_s / firings * 1e6:8.1f} us")
    print(f"plain loop calling the kernel:             {direct:8.2f} us")
    print(f"ratio runtime / plain call:                {med / direct:8.1f}x")
    fev = sorted(fused.trace.select(rank=0, lane="compute"), key=lambda e: e.start)
    fmed = statistics.median(b.start - a.start for a, b in zip(fev, fev[1:]))
    print(f"fused chain, median start-to-start per part: {fmed:6.1f} us   ({med / fmed:.1f}x less than unfused)")
    print(f"fused run wall time per part (incl. setup):  {fused.wall_s / len(fev) * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
