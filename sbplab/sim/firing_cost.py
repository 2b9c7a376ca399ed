"""How long one firing of an actor takes on a Hardware: the only place the simulator turns work into seconds.

- Compute: ``hw.op_time(op_key(op, local input shapes, dtype, device), flops, bytes)``: the measured
  table where calibrated, a roofline on the peaks elsewhere. FLOPs and bytes come from the op
  registry (applied to local shapes, so they are this rank's share); a plain ``module:function``
  kernel (local boxing steps, hand-written kernels) moves its inputs and outputs through memory, with
  the registry's FLOPs when an op of the same name exists. Sources, sinks and states hand over a
  register (no kernel); an Accumulate reads its input and reads and writes its buffer.
- Every firing also costs the runtime's ``hw.firing_overhead`` (scheduling, bookkeeping).
- Communication: the boxing kind's own duration (``sbplab.boxing.kinds``) from the bytes each rank
  sends and the mesh axis it crosses; send/recv are point-to-point moves. Where the calibration
  measured the link with every core computing, how much longer it then takes (``busy_extra``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from ..hardware import Hardware, op_key
from ..ops.registry import REGISTRY, TensorMeta
from ..runtime.specs import Accumulate, Actor, Collective, Compute, Recv, Send
from .comm_time import CommInfo, comm_duration, comm_info
from .shapes import ActorShapes, kernel_of, nbytes
from .sim_errors import SimulationError


@dataclass(frozen=True)
class FiringCost:
    """One firing of one actor on one rank: seconds at full speed, and where the figure came from.

    seconds: compute work (stretched by core sharing in the simulation) or transfer time.
    measured: the compute figure came from the calibrated table, not the roofline.
    modelled: a compute kernel whose figure is the roofline (False for hand-overs and comm).
    nbytes: bytes this rank sends (communication), else 0.
    overhead: the runtime's share of ``seconds`` (firing overhead), the rest is the kernel or transfer.
    busy_extra: communication only, the seconds the transfer takes longer while every core of the
        machine computes (``CommFit.busy_alpha``); the engine adds it to a transfer that starts while
        every core computes, for as long as none comes free.
    """

    seconds: float
    measured: bool = False
    modelled: bool = False
    nbytes: int = 0
    overhead: float = 0.0
    busy_extra: float = 0.0


def _flops(name: str, ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...], attrs: dict) -> float:
    opdef = REGISTRY.get(name) or REGISTRY.get(name.rsplit(":", 1)[-1])
    if opdef is None:
        return 0.0
    try:
        return float(opdef.flops(list(ins), list(outs), attrs))
    except Exception:  # noqa: BLE001 - a kernel sharing a name but not the attrs: count bytes only
        return 0.0


@functools.cache
def _moved_rule(op: str):
    """A plain kernel's own count of the bytes it moves, ``moved_bytes(in_bytes, attrs) -> int | None``
    (a bucket's unpack returns views: 0; its pack copies only gradients not already in place), or None:
    inputs plus outputs."""
    return getattr(kernel_of(op), "moved_bytes", None) if ":" in op else None


def _dtype(shapes: ActorShapes):
    metas = shapes.inputs or shapes.outputs
    return metas[0].dtype if metas else None


def device_of(hw: Hardware) -> str:
    """The device type ``hw`` describes, which a device-free plan or search prices its ops on: the one its
    measured op times were taken on, else "cpu" for ranks sharing a machine's cores (``hw.cores``) and
    "cuda" for a device per rank (the GPU presets)."""
    measured = {key[3] for key, _ in hw.op_times}
    if len(measured) == 1:
        return measured.pop()
    return "cpu" if hw.cores is not None else "cuda"


def compute_cost(a: Actor, shapes: ActorShapes, hw: Hardware, device_type: str | None,
                 cache: dict | None = None, compute_dtype: torch.dtype | None = None) -> FiringCost:
    """Seconds of one firing of a compute-lane actor (kernel time plus the firing overhead); ``cache``
    is shared by the ranks of one simulation (same op, shapes and attributes: same cost).
    ``device_type`` None (a device-free plan): the hardware's device (``device_of``).
    ``compute_dtype``: a forward or backward kernel on fp32 tensors is priced at this dtype (its peak,
    its bytes): the step's precision where the graph was traced without it (``step_pricing.py``)."""
    if device_type is None:
        device_type = device_of(hw)
    if compute_dtype is not None and (a.phase not in ("forward", "backward") or _dtype(shapes) != torch.float32):
        compute_dtype = None
    if cache is None:
        return _compute_cost(a, shapes, hw, device_type, compute_dtype)
    if shapes.attrs is None:  # attributes that cannot be hashed: no sharing
        return _compute_cost(a, shapes, hw, device_type, compute_dtype)
    key = (type(a), a.label, shapes, compute_dtype)
    c = cache.get(key)
    if c is None:
        c = cache[key] = _compute_cost(a, shapes, hw, device_type, compute_dtype)
    return c


def _moved(ins, outs, compute_dtype: torch.dtype | None) -> float:
    """Bytes a kernel reads and writes; at ``compute_dtype`` its floating tensors shrink with it."""
    if compute_dtype is None:
        return sum(nbytes(m) for m in ins) + sum(nbytes(m) for m in outs)
    ratio = compute_dtype.itemsize / 4
    return sum(nbytes(m) * (ratio if m.dtype == torch.float32 else 1) for m in (*ins, *outs))


def kernel_seconds(op: str, ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...], attrs: dict, hw: Hardware,
                   device_type: str, compute_dtype: torch.dtype | None = None) -> tuple[float, bool]:
    """(seconds, measured) of one kernel ``op`` on local ``ins`` -> ``outs`` (without the firing overhead):
    the one price of a Compute actor, which the re-rank's floors (``search/sim_floor.py``,
    ``search/deduced_floor.py``) also read, so a floor and a simulation can never price an op two ways."""
    metas = ins or outs
    dtype = compute_dtype or (metas[0].dtype if metas else None)
    rule = _moved_rule(op)
    own = None if rule is None or compute_dtype is not None else rule([nbytes(m) for m in ins], attrs)
    key = op_key(op, [m.shape for m in ins], dtype or "float32", device_type)
    return hw.op_time(key, _flops(op, ins, outs, attrs), _moved(ins, outs, compute_dtype) if own is None else own,
                      dtype)


def _compute_cost(a: Actor, shapes: ActorShapes, hw: Hardware, device_type: str,
                  compute_dtype: torch.dtype | None = None) -> FiringCost:
    over = hw.firing_overhead
    ins, outs = shapes.inputs, shapes.outputs
    if isinstance(a, Compute):
        t, measured = kernel_seconds(a.op, ins, outs, a.attrs, hw, device_type, compute_dtype)
        return FiringCost(t + over, measured, not measured, overhead=over)
    if isinstance(a, Accumulate):
        dtype = _dtype(shapes)
        key = op_key(a.label, [m.shape for m in ins], dtype or "float32", device_type)
        acc = 3 * sum(nbytes(m) for m in ins)  # read the term, read and write the buffer
        t, measured = hw.op_time(key, sum(m.numel for m in ins), acc, dtype)
        return FiringCost(t + over, measured, not measured, overhead=over)
    return FiringCost(over, overhead=over)  # Source, Sink, State: a register changes hands, no kernel


def comm_cost(a: Actor, rank: int, shapes: ActorShapes, hw: Hardware,
              extra: Mapping[str, CommInfo] | None = None, compute_dtype: torch.dtype | None = None) -> FiringCost:
    """Seconds of one communication firing (the transfer, as every member sees it). ``compute_dtype``: an
    activation moved in fp32 (a forward communication, or a backward one per micro-batch) is priced at this
    dtype's bytes, as the step's precision would move it; gradient reductions (once per step) keep theirs."""
    if not isinstance(a, (Collective, Send, Recv)):
        raise SimulationError(f"actor {a.name!r} ({a.kind}) is not a communication actor")
    info = comm_info(a, rank, shapes, (extra or {}).get(a.name))
    metas = shapes.inputs or shapes.outputs
    if (compute_dtype is not None and metas and metas[0].dtype == torch.float32
            and (a.phase == "forward" or (a.phase == "backward" and a.scope == "micro"))):
        info = replace(info, bytes_sent=int(info.bytes_sent * compute_dtype.itemsize / 4))
    quiet = comm_duration(info, hw)
    return FiringCost(quiet + hw.firing_overhead, nbytes=info.bytes_sent, overhead=hw.firing_overhead,
                      busy_extra=max(0.0, comm_duration(info, hw, busy=True) - quiet))
