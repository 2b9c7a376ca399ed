"""plan_boxing: validate a request, find the cheapest route (and move, across placements), and turn it
into a BoxingPlan whose steps name real ranks.

Across placements the plan is: box on the source to some X, move X to Y, box on the destination
from Y. Every X and Y are tried (routes from the source and to the destination are one Dijkstra each)
with branch and bound on a lower bound of the move, so the cheapest of all such plans wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import torch

from ..errors import InputError, InputTypeError
from ..hardware import Hardware
from ..layout import check_layout
from ..placement import Placement
from ..sbp import NdSbp, SbpParallel, as_nd_sbp, fmt_sbp
from .costs import edge_cost
from .kinds import kind_of, on_change
from .move import has_partial, move_lower_bound, plan_move
from .plan import BoxingPlan
from .route import BoxingError, Hop, Key, add, apply_hops, find_route, partial_ops, routes_from, routes_to
from .step import BoxingStep

SbpLike = str | SbpParallel | Iterable[SbpParallel]


def _axis_steps(shape, state: NdSbp, hops: tuple[Hop, ...], placement: Placement, itemsize: int,
                hardware: Hardware, note: str = "") -> list[BoxingStep]:
    ranks = placement.rank_list  # flat row-major, the order of costs' per-coordinate tuples
    steps = []
    for (axis, new), s in zip(hops, apply_hops(state, hops)):
        c = edge_cost(shape, placement.shape, s, axis, new, itemsize, hardware)
        nxt = s[:axis] + (new,) + s[axis + 1:]
        kind = kind_of(c.kind)
        steps.append(BoxingStep(
            kind=c.kind, mesh_axis=axis, src_sbp=s, dst_sbp=nxt, placement=placement,
            groups=() if kind.is_local else tuple(placement.groups(axis)),
            bytes_sent=dict(zip(ranks, c.sent)), bytes_recv=dict(zip(ranks, c.recv)), time_s=c.time_s,
            why=kind.explain(s[axis], new, placement.axis_label(axis)) + note, reduce_op=c.reduce_op))
    return steps


def _move_step(shape, x: NdSbp, y: NdSbp, src_pl: Placement, dst_pl: Placement, itemsize: int,
               hardware: Hardware) -> BoxingStep:
    m = plan_move(shape, x, y, src_pl, dst_pl, itemsize, hardware)
    pairs = tuple(sorted({(t.src_rank, t.dst_rank) for t in m.transfers
                          if t.src_rank != t.dst_rank or src_pl.device_type != dst_pl.device_type}))
    why = kind_of(m.kind).explain_move(x, y, src_pl, dst_pl, m.transfers)  # type: ignore[attr-defined]
    return BoxingStep(kind=m.kind, mesh_axis=None, src_sbp=x, dst_sbp=y, placement=dst_pl, groups=pairs,
                      bytes_sent=dict(m.sent), bytes_recv=dict(m.recv), time_s=m.time_s,
                      why=why, src_placement=src_pl, transfers=m.transfers)


@lru_cache(maxsize=4096)
def find_cross(shape: tuple[int, ...], src: NdSbp, dst: NdSbp, src_pl: Placement, dst_pl: Placement,
               itemsize: int, hardware: Hardware) -> tuple[NdSbp, NdSbp, Key]:
    """The intermediate layouts (X on the source, Y on the destination) of the cheapest move.

    Deterministic: every candidate list is in an order fixed by the search (routes in the order
    Dijkstra settles them, its ties broken by state numbers) or by the layouts' text, never by hashing,
    so every process picks the same plan among equal-cost ones.
    """
    ops = partial_ops(src, dst)
    fr = routes_from(shape, src, src_pl.shape, itemsize, hardware, ops)
    to = routes_to(shape, dst, dst_pl.shape, itemsize, hardware, ops)
    best: tuple[Key, NdSbp, NdSbp] | None = None

    def consider(x: NdSbp, y: NdSbp) -> None:
        nonlocal best
        m = plan_move(shape, x, y, src_pl, dst_pl, itemsize, hardware)
        if m is None:
            return
        k = add(add(fr[x].key, m.key), to[y].key)
        if best is None or k < best[0]:
            best = (k, x, y)

    if src_pl.shape == dst_pl.shape:  # 1:1 moves keep any layout, partial ones too
        # equal-cost layouts in their written order: the first one found wins a tie, so the order must
        # not depend on hashing (a set of SBP tuples iterates differently per PYTHONHASHSEED)
        both = sorted((s for s in fr if s in to), key=lambda s: (add(fr[s].key, to[s].key), fmt_sbp(s)))
        for x in both:
            if best is not None and add(fr[x].key, to[x].key) >= best[0]:
                break
            consider(x, x)
    xs = sorted((s for s in fr if not has_partial(s)), key=lambda s: fr[s].key)
    ys = sorted(((add(to[s].key, move_lower_bound(shape, s, src_pl, dst_pl, itemsize, hardware)), s)
                 for s in to if not has_partial(s)), key=lambda t: t[0])
    for x in xs:
        if not ys or (best is not None and add(fr[x].key, ys[0][0]) >= best[0]):
            break
        for bound, y in ys:
            if best is not None and add(fr[x].key, bound) >= best[0]:
                break
            consider(x, y)
    if best is None:
        raise BoxingError(f"no way to move shape {shape} from {fmt_sbp(src)} on {src_pl} to {fmt_sbp(dst)} "
                          f"on {dst_pl}")
    return best[1], best[2], best[0]


on_change(find_cross.cache_clear)


def _validate(shape, sbp: SbpLike, placement: Placement, what: str, dtype: torch.dtype) -> NdSbp:
    nd = as_nd_sbp(sbp, placement.ndim, len(shape), what=what)
    check_layout(shape, placement, nd, what=what, dtype=dtype)
    return nd


@lru_cache(maxsize=4)
def _default_hardware(device_type: str | None) -> Hardware:
    """``Hardware.cpu_box()`` for cpu and device-free placements (this machine), ``Hardware.h100_node()``
    for cuda ones (made once: equal presets are equal keys, and most plans in a compile ask for the default)."""
    return Hardware.h100_node() if device_type == "cuda" else Hardware.cpu_box()


def plan_boxing(shape: Iterable[int], src_sbp: SbpLike, dst_sbp: SbpLike, placement: Placement,
                dst_placement: Placement | None = None, dtype: torch.dtype = torch.float32,
                hardware: Hardware | None = None) -> BoxingPlan:
    """Plan how a tensor of ``shape`` goes from ``src_sbp`` on ``placement`` to ``dst_sbp`` on
    ``dst_placement`` (default: the same placement).

    SBPs may be strings (``"S(0), B"``), single SBPs on a 1-D mesh, or tuples. ``hardware`` defaults
    to ``Hardware.cpu_box()`` for cpu and device-free placements and ``Hardware.h100_node()`` for cuda ones.
    """
    try:
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise InputTypeError(f"plan_boxing: shape must be a sequence of ints, got {shape!r}") from None
    if any(n < 0 for n in shape):
        raise InputError(f"plan_boxing: shape {shape} has a negative dim; dims must be >= 0")
    if not isinstance(placement, Placement):
        raise InputTypeError(f"plan_boxing: placement must be an sl.Placement, got {type(placement).__name__}")
    dst_pl = placement if dst_placement is None else dst_placement
    if not isinstance(dst_pl, Placement):
        raise InputTypeError(f"plan_boxing: dst_placement must be an sl.Placement or None, got {type(dst_pl).__name__}")
    if not isinstance(dtype, torch.dtype):
        raise InputTypeError(f"plan_boxing: dtype must be a torch.dtype such as torch.float32, got {dtype!r}")
    if hardware is None:
        hardware = _default_hardware(placement.device_type)
    elif not isinstance(hardware, Hardware):
        raise InputTypeError(f"plan_boxing: hardware must be an sl.Hardware or None, got {type(hardware).__name__}")
    src = _validate(shape, src_sbp, placement, "plan_boxing: src_sbp", dtype)
    dst = _validate(shape, dst_sbp, dst_pl, "plan_boxing: dst_sbp", dtype)
    itemsize = dtype.itemsize
    if dst_pl.same_devices(placement):
        route = find_route(shape, src, dst, placement.shape, itemsize, hardware)
        steps = _axis_steps(shape, src, route.hops, placement, itemsize, hardware)
        return BoxingPlan(shape, dtype, placement, dst_pl, src, dst, tuple(steps), hardware)
    x, y, _ = find_cross(shape, src, dst, placement, dst_pl, itemsize, hardware)
    ops = partial_ops(src, dst)
    before = routes_from(shape, src, placement.shape, itemsize, hardware, ops)[x].hops
    after = routes_to(shape, dst, dst_pl.shape, itemsize, hardware, ops)[y].hops
    steps = _axis_steps(shape, src, before, placement, itemsize, hardware, note=" (before the move)")
    steps.append(_move_step(shape, x, y, placement, dst_pl, itemsize, hardware))
    steps += _axis_steps(shape, y, after, dst_pl, itemsize, hardware, note=" (after the move)")
    return BoxingPlan(shape, dtype, placement, dst_pl, src, dst, tuple(steps), hardware)


def boxing_cost(shape: tuple[int, ...], src: NdSbp, dst: NdSbp, placement: Placement, dtype: torch.dtype,
                hardware: Hardware | None = None) -> tuple[float, int, int]:
    """(seconds, bytes sent, steps) of ``plan_boxing(shape, src, dst, placement, dtype=dtype,
    hardware=hardware)`` without making the plan: the same checks, route and step costs, summed in step
    order as the plan sums them (equal to the last bit). For callers that price many boxings and keep
    few: deduction ranks several targets per input and plans only the one it chooses."""
    hw = hardware if hardware is not None else _default_hardware(placement.device_type)
    for nd, what in ((src, "src_sbp"), (dst, "dst_sbp")):
        check_layout(shape, placement, nd, what=f"plan_boxing: {what}", dtype=dtype)
    size = dtype.itemsize
    route = find_route(shape, src, dst, placement.shape, size, hw)
    costs = [edge_cost(shape, placement.shape, s, axis, new, size, hw)
             for (axis, new), s in zip(route.hops, apply_hops(src, route.hops))]
    return float(sum(c.time_s for c in costs)), int(sum(sum(c.sent) for c in costs)), len(costs)
