"""A floor under a compiled candidate's simulated step time, from its deduction alone: every op and every
collective of the training step, before the expensive half of compiling (expansion into a physical graph,
lowering to actors) and the simulation.

Why: the forward-op floor (``sim_floor.py``) leaves most of a step out (the backward, the update, the
communication), so at 64 ranks the re-rank still compiled and simulated presets at 2-3x the winner's time,
one to two seconds each. The deduction (a tenth of that) already says, for every op, its signature and so
its local shapes on each rank, and for every boxing its steps, groups and bytes.

What makes it a floor: ``sl.simulate`` gives each rank one compute lane and one communication lane, each
running one firing at a time. On a rank:
- every op of the training graph but an accumulation is one ``Compute`` firing per micro-batch (an op that
  reads a per-micro-batch value) or per step (the rest), priced by ``firing_cost.kernel_seconds`` on its
  local shapes, the function the simulator prices it with; firing overheads, boxing kernels, accumulations,
  recomputation and optimizer traffic only add;
- every collective step of a boxing it takes part in is one transfer per micro-batch or per step, priced by
  the simulator's ``comm_duration`` (the kind's alpha-beta time); a parameter gradient's reduction only at
  its bytes over the bandwidth, as gradient buckets (``lowering/buckets.py``) merge several and pay one
  latency; a message the step's precision shrinks is counted at the smaller size; point-to-point moves
  between stages only add.
So a step takes at least the larger of the two sums, on any one rank; the floor is the largest over the first
rank of every placement (a balanced split gives the first rank the largest block). The 3-step window of
``sl.simulate`` may come out slightly below a long-run figure, so the re-rank skips only with a margin
(``sim_floor.MARGIN``) and stops skipping if a simulated candidate ever lands below its floor.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..compiler.deduction.caches import freeze
from ..hardware import Hardware
from ..ops.registry import TensorMeta, get_op, local_context
from ..sim.comm_time import CommInfo, comm_duration
from ..sim.firing_cost import device_of, kernel_seconds
from ..sim.step_pricing import compute_dtype_of

BEFORE, EACH, AFTER = 0, 1, 2  # when a value is made: once before the micro-batches, per micro-batch, after


def _whens(g) -> tuple[dict[str, int], dict[str, int]]:
    """(tensor -> when it is made, op -> when it fires), as the physical graph's nodes get it
    (``expand._Lowerer._when``): inputs per micro-batch, parameters and states before; an op per
    micro-batch if it reads a per-micro-batch value, after if it reads an accumulated gradient (or is an
    update reading a per-micro-batch value), else before. An accumulation's readers come after it."""
    made = {name: EACH if g.tensors[name].role == "input" else BEFORE for name in g.sources()}
    fires: dict[str, int] = {}
    for op in g.ops:
        got = [made.get(t, BEFORE) for t in op.inputs]
        if AFTER in got:
            w = AFTER
        elif EACH in got:
            w = AFTER if op.phase == "update" else EACH
        else:
            w = BEFORE
        fires[op.name] = w
        for o in op.outputs:
            made[o] = AFTER if op.type == "acc" else w
    return made, fires


def _boxings_used(d) -> list:
    """The boxings a physical graph expands: read by an op, storing an output, writing a state back, and
    the boxings those start from."""
    ids = {b for c in d.choices.values() for b in c.reads if b is not None}
    ids |= set(d.store_boxing.values()) | set(d.write_backs.values())
    todo = list(ids)
    while todo:
        src = d.boxings[todo.pop()].source
        if src is not None and src not in ids:
            ids.add(src)
            todo.append(src)
    return [d.boxings[i] for i in sorted(ids)]


def deduced_floor(d, hw: Hardware) -> float:
    """Seconds per step ``sl.simulate`` cannot go below for the deduction ``d`` on ``hw`` (the mesh's
    view of the hardware the candidate is simulated on); 0 where the hardware has measured op times (a
    table may key a kernel as the runtime names it, not as the graph does)."""
    if hw.op_times:
        return 0.0
    g = d.graph
    M = max(1, int(g.micro_batches or 1))
    made, fires = _whens(g)
    times = {w: M if w == EACH else 1 for w in (BEFORE, EACH, AFTER)}
    low = compute_dtype_of(g, d.strategy)
    device = next((op.placement.device_type for op in g.ops if op.placement.device_type), None) or device_of(hw)
    compute: dict[int, float] = {}
    cache: dict = {}
    for op in g.ops:
        if op.type == "acc":
            continue
        r = op.placement.rank_list[0]
        t = local_kernel_seconds(op, g, d.choices[op.name].signature, op.placement, r, hw, device, low, cache)
        if t is None:
            return 0.0  # a layout the registry cannot localise: no floor
        compute[r] = compute.get(r, 0.0) + t * times[fires[op.name]]
    comm: dict[int, float] = {}
    grads = set(g.grads.values())
    for b in _boxings_used(d):
        meta = g.tensors[b.tensor].meta
        ratio = low.itemsize / 4 if low is not None and meta.dtype == torch.float32 and b.phase != "update" else 1
        for step in b.plan.steps:
            if step.mesh_axis is None or not step.kind_obj.is_collective:
                continue
            r = step.placement.rank_list[0]
            group = next((grp for grp in step.groups if r in grp), None)
            if group is None or len(group) < 2:
                continue
            info = CommInfo(step.kind, step.mesh_axis, len(group), int(step.bytes_sent.get(r, 0) * ratio), tuple(group))
            t = comm_duration(info, hw)
            if b.tensor in grads and step.kind_obj.bucket_layout is not None:  # may share a bucket's latency
                t -= comm_duration(replace(info, bytes_sent=0), hw)
            comm[r] = comm.get(r, 0.0) + max(0.0, t) * times[made.get(b.tensor, BEFORE)]
    return max([*compute.values(), *comm.values(), 0.0])


def local_kernel_seconds(op, g, sig, placement, r: int, hw: Hardware, device: str, low: torch.dtype | None,
                         cache: dict) -> float | None:
    """Kernel seconds of ``op`` of graph ``g`` under ``sig`` on rank ``r`` of ``placement``, as the simulator
    prices its Compute firing (``kernel_seconds`` on the local shapes; a forward or backward kernel on fp32 at
    ``low``, the step's compute dtype); None where the registry cannot localise the layout. Both re-rank
    floors read it (``sim_floor.py``: forward ops on the search's placement)."""
    metas = tuple(g.tensors[i].meta for i in op.inputs)
    key = (op.type, metas, freeze(op.attrs), sig, placement, r, op.phase, low)
    got = cache.get(key, False)
    if got is not False:
        return got
    opdef = get_op(op.type)
    try:  # the graph's output metas are its ops' inferred ones
        ctx = local_context(opdef, list(metas), dict(op.attrs), sig, placement, r,
                            tuple(g.tensors[o].meta for o in op.outputs))
    except (ValueError, KeyError, IndexError, TypeError):
        ctx = None
    if ctx is None:
        cache[key] = None
        return None
    lin = tuple(TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ctx.in_blocks, metas))
    lout = tuple(TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ctx.out_blocks, ctx.out_metas))
    first = (lin or lout)[0].dtype if (lin or lout) else None
    dtype = low if low is not None and op.phase in ("forward", "backward") and first == torch.float32 else None
    try:
        attrs = opdef.localize(dict(op.attrs), ctx)
    except Exception:  # noqa: BLE001 - the simulator counts such a kernel's bytes only
        attrs = {}
    t = float(kernel_seconds(op.type, lin, lout, attrs, hw, device, dtype)[0])
    cache[key] = t
    return t
