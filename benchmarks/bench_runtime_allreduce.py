"""All-reduce inside the runtime against a raw ``dist.all_reduce`` of the same size (goal: >= 0.9).

Both run on 2 Gloo ranks of this machine, in this one run, same tensor sizes; each figure is the
median time of one all-reduce, best of a few rounds. In the runtime each step accumulates a
gradient into a fresh buffer and all-reduces it in place, as a DP step does; its time is the
all-reduce firing in the trace, from posting to the completion the comm lane sees. The raw
figure is a hand-written torch.distributed loop timing ``dist.all_reduce`` calls. Ratio = raw
time / runtime time (= runtime bandwidth / raw bandwidth).

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
REPS, ROUNDS = 20, 3


def raw_worker(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for mb in SIZES_MB:
        t = torch.ones(int(mb * 2**20 / 4))
        dist.all_reduce(t)
        best = float("inf")
        for _ in range(ROUNDS):
            dist.barrier()
            times = []
            for _ in range(REPS):
                t0 = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - t0)
            best = min(best, statistics.median(times))
        if rank == 0:
            out[mb] = best
    dist.destroy_process_group()


def raw_times() -> dict[float, float]:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as m:
        out = m.dict()
        mp.start_processes(raw_worker, args=(free_port(), out), nprocs=2, start_method="spawn")
        return dict(out)


def runtime_times(cluster: LocalCluster) -> dict[float, float]:
    out = {}
    for mb in SIZES_MB:
        n = int(mb * 2**20 / 4)
        # a gradient's path: accumulated into a fresh buffer, then all-reduced in place
        ranks = {r: [State("g", init=torch.ones(n), registers=1),
                     Accumulate("acc", inputs=("g",), registers=1),
                     Collective("ar", group=(0, 1), inputs=("acc",), scope="step", registers=1)]
                 for r in (0, 1)}
        plan = ActorPlan.build(2, ranks, name=f"all-reduce-{mb}MB")
        cluster.run(plan, steps=2, progress=False)  # warm-up
        best = float("inf")
        for _ in range(ROUNDS):
            ev = cluster.run(plan, steps=REPS, progress=False).trace.select(rank=0, actor="ar")
            best = min(best, statistics.median(e.dur for e in ev) / 1e6)
        out[mb] = best
    return out


def main() -> None:
    with LocalCluster(2, threads=1) as cluster:
        rt = runtime_times(cluster)
    raw = raw_times()
    print(f"{'size':>8} {'raw dist.all_reduce':>20} {'in runtime':>12} {'ratio raw/runtime':>18}")
    for mb in SIZES_MB:
        ratio = raw[mb] / rt[mb]
        print(f"{mb:>6} MB {raw[mb] * 1e3:>17.2f} ms {rt[mb] * 1e3:>9.2f} ms {ratio:>12.2f}  "
              f"(goal >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")


if __name__ == "__main__":
    main()
