"""sbplab's runtime against hand-written torch.distributed programs doing the same per-rank work.

Same model, shapes and collectives, 2 Gloo ranks of this machine, measured side by side in this
one run (goal: sbplab / torch <= 1.10 each; against DTensor <= 1.0):

- DP MLP (forward, backward, SGD): per-rank replica, every gradient all-reduced.
- Megatron TP MLP: fc1 column-parallel, fc2 row-parallel, one all-reduce forward and one backward
  per block; hand-written with autograd functions, and with DTensor's parallelize_module.
- 2-stage pipeline, 4 micro-batches: torch.distributed.pipelining's ScheduleGPipe. sbplab runs it
  twice: with the lowering's default registers (OneFlow's rule, max(2, S - s) micro-batches in
  flight on stage s: 1F1B's memory) and with MICRO registers everywhere, the memory GPipe uses
  (every micro-batch's activations alive until its backward). Same work and messages either way;
  the registers only decide how far a stage may run ahead.

Time per step is the steady state: the mean over STEPS steps after WARM warm-up steps, timed over
the same span on both sides: from the end of the warm-up (torch: a barrier after step WARM - 1;
sbplab, from the trace: the last firing of step WARM - 1 on any rank) to the end of the last step
(torch: a barrier; sbplab: the last firing of the run). Both sides run ROUNDS times, alternating,
and keep their best. Also printed for sbplab: the span from the first firing of step WARM, which
counts work of step WARM that the runtime starts early (sources have two registers, so they fire
a step ahead) and so overstates the time per step.

    .venv/bin/python benchmarks/bench_runtime_vs_torch.py
"""

from __future__ import annotations

import copy
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from sbplab.compiler import SGD, compile, presets
from sbplab.models import MLP, MLPConfig
from sbplab.runtime import LocalCluster, lower_to_actors
from sbplab.runtime.cluster import free_port

CFG = MLPConfig(in_dim=256, width=256, hidden=1024, n_blocks=2, n_classes=16)
BATCH, MICRO, LR, WARM, STEPS, ROUNDS = 128, 4, 0.05, 2, 8, 3


def _init(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)


def _timed(rank: int, out, key: str, step) -> None:
    for i in range(WARM + STEPS):
        if i == WARM:
            dist.barrier()
            t0 = time.perf_counter()
        step()
    dist.barrier()
    if rank == 0:
        out[key] = (time.perf_counter() - t0) / STEPS


def _plain_step(opt, loss_of):
    """One ordinary torch training step: loss, zero_grad, backward, optimizer step."""
    def step():
        loss = loss_of()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


# --- hand-written programs ---------------------------------------------------------------------------
def dp_worker(rank, port, model, x, y, out):
    _init(rank, port)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xl, yl = x.chunk(2)[rank], y.chunk(2)[rank]

    def step():
        loss = F.cross_entropy(model(xl), yl, reduction="sum") / BATCH
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    _timed(rank, out, "dp", step)


class _CopyToTP(torch.autograd.Function):  # Megatron's f: identity forward, all-reduce backward
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _ReduceFromTP(torch.autograd.Function):  # Megatron's g: all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def _shard_megatron(model: MLP, rank: int) -> MLP:
    m = copy.deepcopy(model)
    for b in m.blocks:
        h = b.fc1.out_features // 2
        b.fc1.weight = nn.Parameter(b.fc1.weight[rank * h:(rank + 1) * h].clone())
        b.fc1.bias = nn.Parameter(b.fc1.bias[rank * h:(rank + 1) * h].clone())
        b.fc2.weight = nn.Parameter(b.fc2.weight[:, rank * h:(rank + 1) * h].clone())
    return m


def tp_worker(rank, port, model, x, y, out):
    _init(rank, port)
    m = _shard_megatron(model, rank)
    opt = torch.optim.SGD(m.parameters(), lr=LR)

    def forward(inp):
        h = m.proj_in(inp)
        for b in m.blocks:
            z = F.linear(b.act(b.fc1(_CopyToTP.apply(h))), b.fc2.weight)
            h = h + _ReduceFromTP.apply(z) + b.fc2.bias
        return m.head(h)

    _timed(rank, out, "tp", _plain_step(opt, lambda: F.cross_entropy(forward(x), y)))


def dtensor_worker(rank, port, model, x, y, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init(rank, port)
    mesh = init_device_mesh("cpu", (2,))
    m = copy.deepcopy(model)
    plan = {}
    for i in range(len(m.blocks)):
        plan[f"blocks.{i}.fc1"], plan[f"blocks.{i}.fc2"] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(m, mesh, plan)
    opt = torch.optim.SGD(m.parameters(), lr=LR)

    _timed(rank, out, "dtensor", _plain_step(opt, lambda: F.cross_entropy(m(x), y)))


def gpipe_worker(rank, port, model, x, y, out):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    _init(rank, port)
    layers = [model.proj_in, *model.blocks, model.head]
    half = len(layers) // 2
    mod = nn.Sequential(*(layers[:half] if rank == 0 else layers[half:]))
    stage = PipelineStage(mod, rank, 2, torch.device("cpu"))
    sched = ScheduleGPipe(stage, MICRO, loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(mod.parameters(), lr=LR)

    def step():
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=[])
        opt.step()
    _timed(rank, out, "gpipe", step)


def torch_times(model, x, y) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as mgr:
        out = mgr.dict()
        for fn in (dp_worker, tp_worker, dtensor_worker, gpipe_worker):
            mp.start_processes(fn, args=(free_port(), model, x, y, out), nprocs=2, start_method="spawn")
        return dict(out)


# --- sbplab ------------------------------------------------------------------------------------------
def sbplab_time(cluster: LocalCluster, model, x, y, strategy,
                registers: int | None = None) -> tuple[float, float, str]:
    """(s per step from the end of the warm-up, s per step from the first firing of step WARM, name)."""
    comp = compile(model, (x,), loss_fn=F.cross_entropy, target=y, optimizer=SGD(lr=LR), strategy=strategy)
    plan = lower_to_actors(comp.physical, comp.graph, world_size=2, registers=registers, name=strategy.name)
    res = cluster.run(plan, {"x": x, "target": y}, steps=WARM + STEPS, progress=False)
    ev = res.trace.events
    warm_end = max(e.end for e in ev if e.step == WARM - 1)
    first = min(e.start for e in ev if e.step == WARM)
    end = max(e.end for e in ev)
    return (end - warm_end) / 1e6 / STEPS, (end - first) / 1e6 / STEPS, strategy.name


def main() -> None:
    torch.manual_seed(0)
    model = MLP(CFG)
    (x,), y = model.example_batch(BATCH)
    ours: dict[str, tuple[float, float, str]] = {}
    ref: dict[str, float] = {}
    for _ in range(ROUNDS):  # alternate, keep each side's best: the machine is shared and noisy
        with LocalCluster(2) as cluster:
            for key, st, regs in (("dp", presets.data_parallel(2), None),
                                  ("tp", presets.tensor_parallel(2), None),
                                  ("gpipe", presets.pipeline(2, MICRO), None),
                                  ("gpipe_m", presets.pipeline(2, MICRO), MICRO)):
                t = sbplab_time(cluster, model, x, y, st, regs)
                ours[key] = min(ours.get(key, t), t)
        for key, t in torch_times(model, x, y).items():
            ref[key] = min(ref.get(key, t), t)
    print(f"MLP {CFG.in_dim}->{CFG.width}, {CFG.n_blocks} blocks of {CFG.hidden}, batch {BATCH}, "
          f"2 Gloo ranks, 1 thread each; ms per step (mean of {STEPS} after {WARM} warm-up, "
          f"best of {ROUNDS})")
    rows = [("DP MLP", "dp", "dp", "hand-written DP", 1.10),
            ("Megatron TP MLP", "tp", "tp", "hand-written Megatron", 1.10),
            ("TP MLP", "tp", "dtensor", "DTensor parallelize_module", 1.0),
            (f"2-stage pipeline, {MICRO} micro", "gpipe", "gpipe", "pipelining ScheduleGPipe", 1.10),
            (f"  same, {MICRO} registers", "gpipe_m", "gpipe", "pipelining ScheduleGPipe", 1.10)]
    for label, ours_key, ref_key, ref_name, goal in rows:
        t, t_first, name = ours[ours_key]
        ratio = t / ref[ref_key]
        print(f"{label:28s} sbplab ({name}) {t * 1e3:8.2f}  vs {ref_name} {ref[ref_key] * 1e3:8.2f}  "
              f"ratio {ratio:5.2f} (goal <= {goal}: {'met' if ratio <= goal else 'NOT met'}); "
              f"from the first firing of step {WARM}: {t_first * 1e3:.2f} ({t_first / ref[ref_key]:.2f})")


if __name__ == "__main__":
    main()
