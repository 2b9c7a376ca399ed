"""sbplab against the PyTorch API a user would pick instead, end-to-end wall time, side by side.

The same MLP (256 -> d -> d -> d -> 16, batch 128, cross-entropy, SGD), the same initial weights and
data, trained by sbplab and by its peer in one script, on 2 and 4 Gloo ranks of this machine, 1 torch
thread per rank:

| sbplab strategy            | peer (real torch API)                                           |
|----------------------------|-----------------------------------------------------------------|
| data parallel              | DistributedDataParallel (bucketed, overlapped all-reduce)       |
| ZeRO-3 (params sharded)    | FSDP2 ``fully_shard`` on every Linear and the root              |
| Megatron tensor parallel   | DTensor ``parallelize_module`` (ColwiseParallel / RowwiseParallel) |
| pipeline GPipe, 4 micro-b. | ``torch.distributed.pipelining`` ScheduleGPipe                   |
| pipeline 1F1B, 4 micro-b.  | ``torch.distributed.pipelining`` Schedule1F1B                    |
| interleaved 1F1B, 2/rank   | ``torch.distributed.pipelining`` ScheduleInterleaved1F1B         |

The interleaved rows hold two stages per rank (one more residual block per rank, so each rank has
two pieces to hold). Each sbplab pipeline row runs the schedule it is named after (``sl.presets.pipeline(..., schedule=)``:
the same per-rank order of forwards and backwards as its torch namesake, checked in
``tests/test_pipeline_schedules.py``), so the two sides of a row run the same schedule.

Time per step is what a user waits for: (wall time of a run of W + N steps - wall time of a run of W
steps) / N, measured on the driver for sbplab (``cluster.run``, plan shipping and result gathering
included) and on rank 0 for the peer (between barriers, inside already-started processes: the peer
pays no process start-up, sbplab pays its per-run set-up in both runs, which cancels). N is ``--steps``
at width 2048 and grows as 2048 / width (96 steps at 256): a step of a few ms needs many of them for a
window this machine's noise does not swamp. Rounds are
interleaved (sbplab, peer, sbplab, peer, ...), after one untimed round that warms both sides up (the
first runs of fresh workers are slower, and the first pair of a cluster would pay for it alone); the
median and the spread (min-max) of each side are printed, with the first-step loss of both to show
they train the same thing.

    .venv/bin/python benchmarks/bench_vs_torch.py            # widths 256 1024 2048, 2 and 4 ranks
    .venv/bin/python benchmarks/bench_vs_torch.py --quick    # width 256, 2 ranks, fewer steps
    python benchmarks/bench_vs_torch.py --device cuda --ranks 2  # NCCL, one GPU per rank, both sides

On CUDA both sides run NCCL with one GPU per rank and the peer synchronises the device before reading
the clock; sbplab's driver waits for the run's results, which the workers send after the last kernel.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import sbplab as sl
from sbplab.models import MLP, MLPConfig

BATCH, MICRO, LR, IN_DIM, CLASSES = 128, 4, 0.05, 256, 16
DEVICE = "cpu"  # --device: "cuda" runs both sides on NCCL, one GPU per rank


def make_model(width: int, blocks: int = 1) -> tuple[MLP, torch.Tensor, torch.Tensor]:
    """256 -> d, ``blocks`` residual blocks d -> d -> d, d -> 16 (pipelines over 4 ranks need 3 blocks)."""
    torch.manual_seed(0)
    model = MLP(MLPConfig(in_dim=IN_DIM, width=width, hidden=width, n_blocks=blocks, n_classes=CLASSES))
    (x,), y = model.example_batch(BATCH)
    return model, x, y


# --- peers: one process per rank, real torch APIs ---------------------------------------------------
def _init(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)


def _sync() -> None:
    """The peer's clock reads after the device is done (a CUDA step returns before its kernels end)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _ddp(model, x, y, rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = DDP(model)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    xl, yl = x.chunk(world)[rank], y.chunk(world)[rank]

    def step():
        loss = F.cross_entropy(m(xl), yl)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach() / world  # the mean over ranks is the global loss
    return step


def _fsdp2(model, x, y, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEVICE, (world,))
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            fully_shard(mod, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xl, yl = x.chunk(world)[rank], y.chunk(world)[rank]

    def step():
        loss = F.cross_entropy(model(xl), yl)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach() / world
    return step


def _dtensor_tp(model, x, y, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(DEVICE, (world,))
    parallelize_module(model, mesh, {"blocks.0.fc1": ColwiseParallel(), "blocks.0.fc2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach() / world  # every rank holds the whole loss
    return step


def _pipelining(schedule_name):
    def build(model, x, y, rank, world):
        from torch.distributed import pipelining

        layers = [model.proj_in, *model.blocks, model.head]
        cuts = [round(i * len(layers) / world) for i in range(world + 1)]
        mod = nn.Sequential(*layers[cuts[rank]:cuts[rank + 1]])
        stage = pipelining.PipelineStage(mod, rank, world, torch.device("cuda", rank) if DEVICE == "cuda"
                                         else torch.device("cpu"))
        sched = getattr(pipelining, schedule_name)(stage, MICRO, loss_fn=F.cross_entropy)
        return _schedule_step(sched, torch.optim.SGD(mod.parameters(), lr=LR), x, y, rank, world)
    return build


def _schedule_step(sched, opt, x, y, rank, world):
    """One training step of a torch pipeline schedule: rank 0 feeds the batch, the last rank the target."""
    def step():
        opt.zero_grad()
        losses: list[torch.Tensor] = []
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        opt.step()
        # the schedule averages nothing: the loss of the batch is the mean of the micro-batch losses
        return torch.stack(losses).mean() if losses else torch.zeros(())  # only the last stage has it
    return step


def _interleaved(model, x, y, rank, world):
    """Two stages per rank (rank r holds stages r and r + world), torch's interleaved 1F1B."""
    from torch.distributed import pipelining

    layers = [model.proj_in, *model.blocks, model.head]
    n = 2 * world
    cuts = [round(i * len(layers) / n) for i in range(n + 1)]
    dev = torch.device("cuda", rank) if DEVICE == "cuda" else torch.device("cpu")
    mods = [nn.Sequential(*layers[cuts[s]:cuts[s + 1]]) for s in (rank, rank + world)]
    stages = [pipelining.PipelineStage(m, s, n, dev) for m, s in zip(mods, (rank, rank + world))]
    sched = pipelining.ScheduleInterleaved1F1B(stages, MICRO, loss_fn=F.cross_entropy)
    opt = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=LR)
    return _schedule_step(sched, opt, x, y, rank, world)


PEERS = {"ddp": _ddp, "fsdp2": _fsdp2, "dtensor": _dtensor_tp,
         "gpipe": _pipelining("ScheduleGPipe"), "1f1b": _pipelining("Schedule1F1B"),
         "interleaved_1f1b": _interleaved}


def _peer_worker(rank, world, port, peer, width, blocks, warm, n, rounds, conn, device="cpu"):
    """Builds the peer once, then per round: time W steps, then W + N steps, and report.

    Each step returns this rank's share of the loss: summed over ranks, the global batch's loss.
    """
    global DEVICE
    DEVICE = device  # a spawned process starts from the module's default
    _init(rank, world, port)
    model, x, y = make_model(width, blocks)
    if DEVICE == "cuda":
        model, x, y = model.cuda(), x.cuda(), y.cuda()
    step = PEERS[peer](copy.deepcopy(model), x, y, rank, world)
    first = step()  # the first training step, also the first loss
    total = first.clone()
    dist.all_reduce(total)
    if rank == 0:
        conn.send(float(total))
    for _ in range(rounds + 1):  # the first round warms up and is dropped by the driver
        got = []
        for k in (warm, warm + n):
            if rank == 0:
                conn.recv()  # the driver says go: rounds interleave with sbplab's
            dist.barrier()
            _sync()
            t0 = time.perf_counter()
            for _ in range(k):
                step()
            _sync()
            dist.barrier()
            got.append(time.perf_counter() - t0)
        if rank == 0:
            conn.send((got[1] - got[0]) / n)
    dist.destroy_process_group()
    conn.close()
    os._exit(0)  # skip interpreter finalization: torch may abort tearing down Gloo's threads (pytorch#179291)


# --- sbplab ----------------------------------------------------------------------------------------
PIPELINES = ("gpipe", "1f1b", "interleaved_1f1b")  # sbplab's schedule of that name against torch's namesake


def sbplab_strategy(kind: str, world: int) -> sl.Strategy:
    if kind == "dp":
        return sl.presets.data_parallel(world)
    if kind == "zero3":
        return sl.presets.zero(world, shard_params=True)
    if kind == "tp":
        return sl.presets.tensor_parallel(world)
    if kind == "interleaved_1f1b":  # two stages per rank: stage s on rank s % world
        return sl.Strategy(sl.mesh(pp=world), [sl.Pipeline("pp", MICRO, schedule=kind, stages_per_rank=2)],
                           name=f"pipeline interleaved 1F1B x{world}")
    return sl.presets.pipeline(world, MICRO, schedule=kind)


PAIRS = [("data parallel", "dp", "ddp", "DDP"), ("ZeRO-3", "zero3", "fsdp2", "FSDP2 fully_shard"),
         ("tensor parallel", "tp", "dtensor", "DTensor parallelize_module"),
         ("pipeline GPipe", "gpipe", "gpipe", "pipelining ScheduleGPipe"),
         ("pipeline 1F1B", "1f1b", "1f1b", "pipelining Schedule1F1B"),
         ("interleaved 1F1B", "interleaved_1f1b", "interleaved_1f1b", "ScheduleInterleaved1F1B")]


def bench_pair(cluster, world: int, width: int, kind: str, peer: str, warm: int, n: int, rounds: int):
    blocks = (2 * world - 1 if kind == "interleaved_1f1b" else max(1, world - 1)) if kind in PIPELINES else 1
    model, x, y = make_model(width, blocks)
    step = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=sl.SGD(lr=LR),
                      strategy=sbplab_strategy(kind, world))
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    port = _free_port()
    procs = [ctx.Process(target=_peer_worker,
                         args=(r, world, port, peer, width, blocks, warm, n, rounds, child, DEVICE))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        peer_first = parent.recv()
        ours_first = cluster.run(step, (x, y), steps=1, progress=False).losses[0]
        ours, theirs = [], []
        for _ in range(rounds + 1):  # round 0 warms both sides up (first runs of fresh workers) and is dropped
            t = []
            for k in (warm, warm + n):
                t0 = time.perf_counter()
                cluster.run(step, (x, y), steps=k, progress=False, trace=False, params=False)
                t.append(time.perf_counter() - t0)
            ours.append((t[1] - t[0]) / n)
            parent.send("go")
            parent.send("go")
            theirs.append(parent.recv())
        ours, theirs = ours[1:], theirs[1:]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return ours, theirs, ours_first, peer_first


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:7.2f} ms [{min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="width 256, 2 ranks, fewer steps and rounds")
    ap.add_argument("--widths", type=int, nargs="*", default=[256, 1024, 2048])
    ap.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="N at width 2048; a narrower width runs more (see below)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None,
                    help="sbplab strategies to run: dp zero3 tp gpipe 1f1b interleaved_1f1b (pipe: every pipeline)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: NCCL, one GPU per rank")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    if a.quick:
        a.widths, a.ranks, a.steps, a.rounds = [256], [2], 6, 2
    gpu = f", {torch.cuda.get_device_name()} x {torch.cuda.device_count()}" if DEVICE == "cuda" else ""
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores{gpu}, torch "
          f"{torch.__version__}, {DEVICE}; W={a.warm}, N={a.steps} x 2048 / width, {a.rounds} interleaved rounds")
    print(f"{'ranks':>5} {'width':>5}  {'sbplab':<18} {'peer':<27} {'sbplab ms [min-max]':<26} "
          f"{'peer ms [min-max]':<26} {'ratio':>5}  first loss (sbplab / peer)")
    for world in a.ranks:
        with sl.LocalCluster(world, DEVICE, threads=1) as cluster:
            for width in a.widths:
                for label, kind, peer, peer_label in PAIRS:
                    if a.only and kind not in a.only and not (kind in PIPELINES and "pipe" in a.only):
                        continue
                    n = a.steps * max(1, 2048 // width)  # a narrow step is short: more of them, a readable window
                    ours, theirs, l0, p0 = bench_pair(cluster, world, width, kind, peer, a.warm, n, a.rounds)
                    ratio = statistics.median(ours) / statistics.median(theirs)
                    print(f"{world:>5} {width:>5}  {label:<18} {peer_label:<27} {_fmt(ours):<26} "
                          f"{_fmt(theirs):<26} {ratio:5.2f}  {l0:.5f} / {p0:.5f}", flush=True)


if __name__ == "__main__":
    main()
