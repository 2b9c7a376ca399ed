"""One-way send/recv latency inside the runtime against raw ``dist.send`` / ``dist.recv``.

A ping-pong between 2 Gloo ranks of this machine: rank 0 sends a small tensor, rank 1 receives it
and sends it straight back, one message in flight at a time. One-way latency = round trip / 2.
In the runtime each round trip is one step: rank 0's State sends its value, rank 1 echoes it
with an empty compute actor, and what comes back is rank 0's next value, so every hop is a
``Send`` firing, a ``Recv`` firing and an actor between them, fired by the firing rule. The raw
figure is a hand-written loop of blocking ``dist.send`` / ``dist.recv`` with the same tensor. Both
are measured in this one run, alternating, best of ROUNDS.

    .venv/bin/python benchmarks/bench_runtime_p2p.py
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sbplab.runtime import ActorPlan, Compute, LocalCluster, Recv, Ref, Send, State
from sbplab.runtime.cluster import free_port

K = "sbplab.runtime.kernels:"
NUMEL, PINGS, ROUNDS = 256, 200, 3


def raw_worker(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.ones(NUMEL)
    for _ in range(20):  # warm-up
        (dist.send, dist.recv)[rank](x, 1 - rank)
        (dist.recv, dist.send)[rank](x, 1 - rank)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(PINGS):
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
    if rank == 0:
        out["raw"] = (time.perf_counter() - t0) / PINGS / 2
    dist.destroy_process_group()


def raw_one_way() -> float:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as m:
        out = m.dict()
        mp.start_processes(raw_worker, args=(free_port(), out), nprocs=2, start_method="spawn")
        return out["raw"]


def ping_pong_plan() -> ActorPlan:
    """Rank 0: x -> ping(send), pong(recv) -> back -> next x; rank 1: ping(recv) -> echo -> pong(send)."""
    shape = (NUMEL,)
    r0 = [State("x", init=torch.ones(shape), update=Ref("back"), registers=1, scope="step"),
          Send("ping", inputs=("x",), peer=1, tag=0, registers=1, scope="step"),
          Recv("pong", peer=1, tag=1, shape=shape, registers=1, scope="step"),
          Compute("back", op=K + "noop", inputs=("pong",), registers=1, scope="step")]
    r1 = [Recv("ping", peer=0, tag=0, shape=shape, registers=1, scope="step"),
          Compute("echo", op=K + "noop", inputs=("ping",), registers=1, scope="step"),
          Send("pong", inputs=("echo",), peer=0, tag=1, registers=1, scope="step")]
    return ActorPlan.build(2, {0: r0, 1: r1}, name="ping-pong")


def runtime_one_way(cluster: LocalCluster, plan: ActorPlan) -> float:
    """From rank 0's first send to its last pong received (one clock), per message."""
    tr = cluster.run(plan, steps=PINGS, progress=False).trace
    pings = tr.select(rank=0, actor="ping")
    backs = tr.select(rank=0, actor="back")
    return (backs[-1].start - pings[0].start) / 1e6 / PINGS / 2


def main() -> None:
    plan = ping_pong_plan()
    best_rt = best_raw = float("inf")
    with LocalCluster(2, threads=1) as cluster:
        cluster.run(plan, steps=1, progress=False)  # warm-up
        for _ in range(ROUNDS):
            best_rt = min(best_rt, runtime_one_way(cluster, plan))
            best_raw = min(best_raw, raw_one_way())
    print(f"one-way latency of a {NUMEL * 4} B message, 2 Gloo ranks, best of {ROUNDS} ({PINGS} round trips)")
    print(f"raw dist.send/recv: {best_raw * 1e3:7.3f} ms")
    print(f"in the runtime:     {best_rt * 1e3:7.3f} ms   ratio runtime/raw {best_rt / best_raw:5.2f}")


if __name__ == "__main__":
    main()
