"""All-reduce inside the runtime against a raw ``dist.all_reduce`` of the same size (goal: >= 0.9).

Both run on 2 Gloo ranks of this machine, in this one run, same tensor sizes; each figure is the
median time of one all-reduce over REPS, best of ROUNDS rounds that alternate between the two
sides (the machine is shared and noisy). In the runtime each step accumulates a
gradient into a fresh buffer and all-reduces it in place, as a DP step does; its time is the
all-reduce firing in the trace, from posting to the completion the comm lane sees. The raw
figure is a hand-written torch.distributed loop doing the same per-rank work: each iteration
copies the gradient into a fresh buffer (what the accumulation does) and times the
``dist.all_reduce`` of it. Ratio = raw time / runtime time (= runtime bandwidth / raw bandwidth).
Also printed: the raw loop all-reducing one and the same tensor over and over (no copy between),
which is a little faster than any training step can be.

    .venv/bin/python benchmarks/bench_runtime_allreduce.py
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sbplab.runtime import Accumulate, ActorPlan, Collective, LocalCluster, State
from sbplab.runtime.cluster import free_port

SIZES_MB = (0.25, 4, 16)
REPS, ROUNDS = 30, 4


def raw_worker(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for mb in SIZES_MB:
        g = torch.ones(int(mb * 2**20 / 4))
        dist.all_reduce(g.clone())
        for fresh in (True, False):
            dist.barrier()
            times = []
            for _ in range(REPS):
                t = g.clone() if fresh else g  # fresh: the accumulation's new buffer
                t0 = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - t0)
            if rank == 0:
                out[(mb, fresh)] = statistics.median(times)
    dist.destroy_process_group()


def raw_times() -> dict[tuple[float, bool], float]:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as m:
        out = m.dict()
        mp.start_processes(raw_worker, args=(free_port(), out), nprocs=2, start_method="spawn")
        return dict(out)


def plans() -> dict[float, ActorPlan]:
    out = {}
    for mb in SIZES_MB:
        n = int(mb * 2**20 / 4)
        # a gradient's path: accumulated into a fresh buffer, then all-reduced in place
        ranks = {r: [State("g", init=torch.ones(n), registers=1),
                     Accumulate("acc", inputs=("g",), registers=1),
                     Collective("ar", group=(0, 1), inputs=("acc",), scope="step", registers=1)]
                 for r in (0, 1)}
        out[mb] = ActorPlan.build(2, ranks, name=f"all-reduce-{mb}MB")
    return out


def runtime_times(cluster: LocalCluster, plans: dict[float, ActorPlan]) -> dict[float, float]:
    out = {}
    for mb, plan in plans.items():
        ev = cluster.run(plan, steps=REPS, progress=False).trace.select(rank=0, actor="ar")
        out[mb] = statistics.median(e.dur for e in ev) / 1e6
    return out


def main() -> None:
    rt = {mb: float("inf") for mb in SIZES_MB}
    raw = {(mb, fresh): float("inf") for mb in SIZES_MB for fresh in (True, False)}
    with LocalCluster(2, threads=1) as cluster:
        ps = plans()
        for plan in ps.values():
            cluster.run(plan, steps=2, progress=False)  # warm-up
        for _ in range(ROUNDS):
            for mb, t in runtime_times(cluster, ps).items():
                rt[mb] = min(rt[mb], t)
            for key, t in raw_times().items():
                raw[key] = min(raw[key], t)
    print(f"{'size':>8} {'raw dist.all_reduce':>20} {'in runtime':>12} {'ratio raw/runtime':>18}   "
          f"(raw on one tensor again and again: time, ratio)")
    for mb in SIZES_MB:
        ratio, same = raw[(mb, True)] / rt[mb], raw[(mb, False)]
        print(f"{mb:>6} MB {raw[(mb, True)] * 1e3:>17.2f} ms {rt[mb] * 1e3:>9.2f} ms {ratio:>12.2f}  "
              f"(goal >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})   "
              f"({same * 1e3:.2f} ms, {same / rt[mb]:.2f})")


if __name__ == "__main__":
    main()
