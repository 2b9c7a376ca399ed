"""Which communication an actor does (kind, mesh axis, group size, bytes) and how long the boxing kind says
it takes.

The facts come from the plan where it carries them (a Collective's ``mesh_axis`` and ``bytes_sent``,
set by the lowering from the boxing step), else from the compiled physical graph's boxing step,
else from the register's shape with the ring byte counts of ``sbplab.boxing.costs`` (a hand-built
plan names no mesh axis: axis 0). The time is the boxing kind's ``duration`` when the kind objects
exist (``sbplab.boxing.kinds``), else the same alpha-beta form on ``Hardware.alpha_beta``.

Mesh axes beyond the Hardware's ``axis_bandwidth`` entries are fine: ``Hardware.link`` repeats the
last axis's figures for them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from ..boxing.costs import RING_STEPS, ring_bytes
from ..hardware import Hardware
from ..layout import balanced_sizes
from ..ops.registry import TensorMeta
from ..runtime.specs import Actor, Collective, Send
from .errors import SimulationError
from .shapes import ActorShapes, Shape, nbytes


@dataclass(frozen=True)
class CommInfo:
    """One communication firing as a boxing kind sees it.

    kind: all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | send_recv.
    mesh_axis: the mesh axis a collective runs on; None for point-to-point moves.
    group_size: ranks taking part.
    bytes_sent: bytes this rank sends.
    """

    kind: str
    mesh_axis: int | None
    group_size: int
    bytes_sent: int


def _attr_bytes(v, rank: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, Mapping):
        return int(v.get(rank, max(v.values(), default=0)))
    return int(v)


# Per collective kind: this rank's output shape and the bytes it sends. They stand in for the boxing
# kinds' own answers (``sbplab.boxing.kinds``) where those do not say; ring byte counts come from
# ``sbplab.boxing.costs`` either way. Each takes (actor, my index in the group, group size, input meta).
def _same_shape(a: Collective, i: int, p: int, x: TensorMeta) -> Shape:
    return x.shape


def _gathered_shape(a: Collective, i: int, p: int, x: TensorMeta) -> Shape:
    shape = list(x.shape)
    shape[a.dim] = sum(a.sizes) if a.sizes else shape[a.dim] * p
    return tuple(shape)


def _scattered_shape(a: Collective, i: int, p: int, x: TensorMeta) -> Shape:
    shape = list(x.shape)
    shape[a.dim] = a.sizes[i] if a.sizes else shape[a.dim] // p
    return tuple(shape)


def _exchanged_shape(a: Collective, i: int, p: int, x: TensorMeta) -> Shape:
    shape = list(_scattered_shape(a, i, p, x))
    shape[a.cat_dim] = sum(a.cat_sizes) if a.cat_sizes else shape[a.cat_dim] * p
    return tuple(shape)


def _elements(x: TensorMeta, a: Collective) -> tuple[int, int, int]:
    """(all elements, elements per index of ``a.dim``, length of ``a.dim``)."""
    D = x.shape[a.dim] if x.shape else 1
    return x.numel, (x.numel // D if D else 0), D


def _sent_all_reduce(a: Collective, i: int, p: int, x: TensorMeta) -> int:
    return ring_bytes("all_reduce", p, i, x.numel, [])[0]


def _sent_all_gather(a: Collective, i: int, p: int, x: TensorMeta) -> int:
    _, rest, D = _elements(x, a)
    chunks = [rest * s for s in (a.sizes or [D] * p)]
    return ring_bytes("all_gather", p, i, sum(chunks), chunks)[0]


def _sent_reduce_scatter(a: Collective, i: int, p: int, x: TensorMeta) -> int:
    T, rest, D = _elements(x, a)
    return ring_bytes("reduce_scatter", p, i, T, [rest * s for s in (a.sizes or balanced_sizes(D, p))])[0]


def _sent_all_to_all(a: Collective, i: int, p: int, x: TensorMeta) -> int:
    T, rest, D = _elements(x, a)
    return T - rest * (a.sizes or balanced_sizes(D, p))[i]  # everything but my own piece leaves


def _sent_broadcast(a: Collective, i: int, p: int, x: TensorMeta) -> int:
    return x.numel if a.group[i] == a.src else 0


_RULES = {"all_reduce": (_same_shape, _sent_all_reduce), "all_gather": (_gathered_shape, _sent_all_gather),
          "reduce_scatter": (_scattered_shape, _sent_reduce_scatter),
          "all_to_all": (_exchanged_shape, _sent_all_to_all), "broadcast": (_same_shape, _sent_broadcast)}


def collective_output(a: Collective, rank: int, x: TensorMeta) -> TensorMeta:
    """The local output meta of collective ``a`` on ``rank`` for input ``x``."""
    shape_of = _RULES[a.kind_][0]
    return TensorMeta(shape_of(a, a.group.index(rank), len(a.group), x), x.dtype)


def _collective_bytes(a: Collective, rank: int, shapes: ActorShapes) -> int:
    x = shapes.inputs[0]
    item = nbytes(x) // x.numel if x.numel else 0
    return _RULES[a.kind_][1](a, a.group.index(rank), len(a.group), x) * item


def comm_info(a: Actor, rank: int, shapes: ActorShapes, known: CommInfo | None = None) -> CommInfo:
    """The kind, axis, group and bytes of ``a`` on ``rank`` (``known``: facts from the compiler)."""
    if isinstance(a, Collective):
        axis = getattr(a, "mesh_axis", None)
        if axis is None:
            axis = known.mesh_axis if known is not None else 0
        if axis is not None and axis < 0:
            raise SimulationError(f"collective {a.name!r}: mesh_axis must be >= 0, got {axis}")
        sent = _attr_bytes(getattr(a, "bytes_sent", None), rank)
        if sent is None:
            sent = known.bytes_sent if known is not None else _collective_bytes(a, rank, shapes)
        return CommInfo(a.kind_, axis, len(a.group), sent)
    metas = shapes.inputs if isinstance(a, Send) else shapes.outputs
    return CommInfo("send_recv", None, 2, sum(nbytes(m) for m in metas))


@functools.cache
def _kind_of():
    """``sbplab.boxing.kinds.kind_of`` where the kinds package exists, else None (asked once)."""
    try:
        from ..boxing.kinds import kind_of  # type: ignore[import-not-found]
    except ImportError:
        return None
    return kind_of


def _kinds_duration(info: CommInfo, hw: Hardware) -> float | None:
    """The boxing kind object's own duration, when the kinds package provides it."""
    kind_of = _kind_of()
    if kind_of is None:
        return None
    try:
        kind = kind_of(info.kind)
    except (KeyError, ValueError):
        return None
    return float(kind.duration(hw, info.mesh_axis, info.group_size, info.bytes_sent))


def comm_duration(info: CommInfo, hw: Hardware) -> float:
    """Seconds one communication firing takes on ``hw`` (alpha-beta, measured fits first)."""
    if info.group_size <= 1:
        return 0.0
    t = _kinds_duration(info, hw)
    if t is not None:
        return t
    if info.mesh_axis is None:  # a point-to-point move between placements
        alpha, bw = hw.alpha_beta(info.kind, None, 2)
        return alpha + info.bytes_sent / bw
    steps = RING_STEPS.get(info.kind, 1) * (info.group_size - 1)
    alpha, bw = hw.alpha_beta(info.kind, info.mesh_axis, info.group_size)
    return alpha * steps + info.bytes_sent / bw
