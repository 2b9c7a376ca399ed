"""Profile compute ops as the plans meet them, the runtime's cost per firing, and this machine's peaks.

FlexFlow profiles every operator once per configuration and reuses the figure; here a configuration
is ``Hardware.op_key``: (op, local input shapes, dtype, device type), found by propagating the local
shapes through the plans exactly as the simulator does (``sbplab.sim.shapes``), so the simulator asks
for the very keys measured here. Each key runs on rank 0 of the real workers inside an ordinary plan
(State actors holding random inputs of those shapes, one Compute actor of that op with its attributes)
and its figure is the median trace duration after warm-up: what the runtime really pays per kernel
with the threads a rank gets. Ranks sharing cores is the simulator's business (``Hardware.cores``).

Measured peaks (a matmul's FLOP/s, a large copy's bytes/s) feed the roofline that stands in for shapes
that were never profiled, so those are modelled from this machine, not a spec sheet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..hardware import OpKey, op_key
from ..ops.registry import TensorMeta
from .actor_plan import ActorPlan
from .actors import resolve_kernel
from .buffers import BufferSlot
from .calibration_common import NOOP, WARMUP_STEPS, gate, median, run_measurement, tick, tock
from .specs import Accumulate, Actor, Compute, State

MATMUL = "sbplab.runtime.kernels:matmul"
COPY = "sbplab.runtime.kernels:narrow_piece"  # narrowing to the whole tensor: a plain clone
PLAN_BYTES = 256 * 2**20  # inputs held by one profiling plan at most
PLAN_OPS = 64  # op instances per profiling plan at most


@dataclass(frozen=True)
class OpInstance:
    """One distinct compute configuration: its table key and what it takes to run it again.

    op: a Compute actor's op (registry name or ``module:function``); for an Accumulate its label.
    accumulate: (reduce, scale) of an Accumulate actor; None for a Compute actor.
    """

    key: OpKey
    op: str
    inputs: tuple[TensorMeta, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    outputs: int = 1
    accumulate: tuple[str, float] | None = None
    into: BufferSlot | None = field(default=None, compare=False, hash=False)  # writes into a run's buffer

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.inputs)


def _steps_list(steps: Any) -> list:
    if steps is None:
        return []
    if isinstance(steps, (list, tuple)):
        return list(steps)
    return [steps]


def op_instances(steps: Any, device_type: str,
                 feeds: Mapping[str, Any] | None = None) -> dict[OpKey, OpInstance]:
    """Every distinct compute configuration of ``steps`` (compiled steps or ActorPlans; ``feeds``: batch
    tensors or shapes for plans with Source actors), keyed as the simulator keys them."""
    from ..sim.predict import plan_of  # the simulator's own lowering and shapes: the same keys
    from ..sim.shapes import batch_shapes, infer_rank_shapes

    found: dict[OpKey, OpInstance] = {}
    for step in _steps_list(steps):
        plan, batch, _ = plan_of(step)
        if plan.device_type not in (None, device_type):  # None: compiled device-free, runs on any
            raise ValueError(f"calibrate: plan {plan.name!r} runs on {plan.device_type} but the cluster runs "
                             f"{device_type}; op times are measured on the cluster's devices")
        batch.update(batch_shapes(feeds))
        cache: dict = {}
        for r, rp in plan.ranks.items():
            shapes = infer_rank_shapes(rp.actors, r, plan.micro_batches, batch, cache)
            for a in rp.actors:
                if isinstance(a, (Compute, Accumulate)):
                    inst = _instance(a, shapes[a.name].inputs, shapes[a.name].outputs, device_type)
                    found.setdefault(inst.key, inst)
    return found


def _instance(a: Compute | Accumulate, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta],
              device_type: str) -> OpInstance:
    metas = ins or outs
    dtype = metas[0].dtype if metas else "float32"
    key = op_key(a.label, [m.shape for m in ins], dtype, device_type)
    if isinstance(a, Accumulate):
        return OpInstance(key, a.label, tuple(ins), outputs=len(ins), accumulate=(a.reduce, a.scale), into=a.into)
    return OpInstance(key, a.op, tuple(ins), dict(a.attrs), a.outputs, into=a.into)


def random_input(meta: TensorMeta, gen: torch.Generator) -> torch.Tensor:
    """Values in [0, 1) for floats (safe for logs and roots), zeros for integers (valid indices)."""
    if meta.dtype.is_floating_point or meta.dtype.is_complex:
        return torch.rand(meta.shape, generator=gen).to(meta.dtype)
    if meta.dtype == torch.bool:
        return torch.ones(meta.shape, dtype=torch.bool)
    return torch.zeros(meta.shape, dtype=meta.dtype)


def runs_here(inst: OpInstance, xs: list[torch.Tensor]) -> str | None:
    """None if the kernel runs on these inputs in this process, else why not (it is then not profiled:
    a kernel that raises on a worker would take the workers down)."""
    if inst.accumulate is not None:
        return None
    try:
        resolve_kernel(inst.op)([x.clone() for x in xs], dict(inst.attrs))
    except Exception as e:  # noqa: BLE001 - any failure: this key stays modelled
        return f"{type(e).__name__}: {e}"
    return None


def _batches(insts: Sequence[OpInstance]) -> Iterable[list[OpInstance]]:
    chunk: list[OpInstance] = []
    held = 0
    for inst in insts:
        if chunk and (len(chunk) >= PLAN_OPS or held + inst.nbytes > PLAN_BYTES):
            yield chunk
            chunk, held = [], 0
        chunk.append(inst)
        held += inst.nbytes
    if chunk:
        yield chunk


def profile_plan(insts: Sequence[tuple[OpInstance, list[torch.Tensor]]], n: int,
                 device_type: str) -> ActorPlan:
    """Rank 0 holds each instance's inputs as States and runs the op once per step (an Accumulate once
    per micro-batch, two per step); the other ranks idle."""
    acts: list[Actor] = []
    for j, (inst, xs) in enumerate(insts):
        names = [f"in{j}_{k}" for k in range(len(xs))]
        acts += [State(nm, init=x) for nm, x in zip(names, xs)]
        # an op that writes into a run's buffer is timed doing so, in a buffer of its own
        into = None if inst.into is None else BufferSlot(f"op{j}", 0, inst.into.shape, inst.into.dtype)
        if inst.accumulate is not None:
            reduce, scale = inst.accumulate
            acts.append(Accumulate(f"op{j}", inputs=tuple(names), reduce=reduce, scale=scale, registers=1,
                                   into=into))
        else:
            acts.append(Compute(f"op{j}", op=inst.op, attrs=dict(inst.attrs), inputs=tuple(names),
                                outputs=inst.outputs, scope="step", registers=1, into=into))
    micro = 2 if any(inst.accumulate for inst, _ in insts) else 1
    return ActorPlan.build(n, {0: acts}, device_type=device_type, micro_batches=micro, name="calibrate-ops")


def profile_ops(cluster, insts: Iterable[OpInstance], repeats: int, seed: int = 0
                ) -> tuple[dict[OpKey, float], dict[OpKey, str]]:
    """(seconds per firing by key, why a key was skipped) for ``insts``, measured on rank 0."""
    gen = torch.Generator().manual_seed(seed)
    times: dict[OpKey, float] = {}
    skipped: dict[OpKey, str] = {}
    for chunk in _batches(list(insts)):
        runnable = []
        for inst in chunk:
            xs = [random_input(m, gen) for m in inst.inputs]
            why = runs_here(inst, xs)
            if why is None:
                runnable.append((inst, xs))
            else:
                skipped[inst.key] = why
        if not runnable:
            continue
        trace = run_measurement(cluster, profile_plan(runnable, cluster.n, cluster.device_type), repeats)
        for j, (inst, _) in enumerate(runnable):
            samples = [e.dur / 1e6 for e in trace.select(rank=0, actor=f"op{j}") if e.step >= WARMUP_STEPS]
            times[inst.key] = median(samples, f"op {inst.op}")
    return times, skipped


# --- peaks for the roofline ----------------------------------------------------------------------
def peak_instances(device_type: str, matmul_n: int, copy_bytes: int) -> tuple[OpInstance, OpInstance]:
    """A square fp32 matmul (FLOP/s) and a copy of ``copy_bytes`` (memory bytes/s)."""
    sq = TensorMeta((matmul_n, matmul_n))
    mm = OpInstance(op_key(MATMUL, [sq.shape, sq.shape], "float32", device_type), MATMUL, (sq, sq))
    numel = max(1, copy_bytes // 4)
    flat = TensorMeta((numel,))
    cp = OpInstance(op_key(COPY, [flat.shape], "float32", device_type), COPY, (flat,),
                    {"dim": 0, "start": 0, "length": numel})
    return mm, cp


def peaks_from(times: Mapping[OpKey, float], mm: OpInstance, cp: OpInstance) -> dict[str, float]:
    """``flops`` and ``mem_bandwidth`` as the roofline counts them: 2mnk FLOPs, bytes read plus written."""
    n = mm.inputs[0].shape[0]
    return {"flops": 2.0 * n**3 / times[mm.key], "mem_bandwidth": 2.0 * cp.nbytes / times[cp.key]}


# --- the runtime's own cost per firing -----------------------------------------------------------
def overhead_plan(n: int, device_type: str, chain: int) -> ActorPlan:
    """Rank 0 runs ``chain`` empty kernels one after another per step, between a tick and a tock."""
    acts: list[Actor] = [tick()]
    prev = "tick"
    for i in range(chain):
        acts.append(gate(f"n{i}", "tick", prev))
        prev = f"n{i}"
    acts.append(tock(prev))
    return ActorPlan.build(n, {0: acts}, device_type=device_type, name="calibrate-overhead")


def measure_firing_overhead(cluster, repeats: int, chain: int = 32) -> float:
    """Seconds the runtime spends per firing besides the kernel: a steady step's wall time, minus the
    empty kernels' own time, divided by the step's firings (the State's and the kernels'). Unfused, as
    every measurement: the simulator charges a fused chain's parts after the first nothing
    (``sim/predict.py``)."""
    trace = run_measurement(cluster, overhead_plan(cluster.n, cluster.device_type, chain), repeats)
    events = trace.select(rank=0)
    ends: dict[int, float] = {}
    kernels: dict[int, float] = {}
    for e in events:
        ends[e.step] = max(ends.get(e.step, float("-inf")), e.end)
        if e.op == NOOP:
            kernels[e.step] = kernels.get(e.step, 0.0) + e.dur
    firings = chain + 2  # tick, the chain, tock
    per = [(ends[s] - ends[s - 1] - kernels.get(s, 0.0)) / firings / 1e6
           for s in sorted(ends) if s >= WARMUP_STEPS and s - 1 in ends]
    return max(0.0, median(per, "the empty-kernel chain"))
