"""Which communication an actor does (kind, mesh axis, group size, bytes) and how long the boxing kind says
it takes.

The facts come from the plan where it carries them (a Collective's ``mesh_axis`` and ``bytes_sent``,
set by the lowering from the boxing step), else from the compiled physical graph's boxing step,
else from the register's shape as the boxing kind counts it (``actor_bytes``; a hand-built plan
names no mesh axis: axis 0). Output shapes, bytes and the time all come from the boxing kind object
(``sbplab.boxing.kinds``), the same one the runtime runs, so nothing here knows a kind by name.

Mesh axes beyond the Hardware's ``axis_bandwidth`` entries are fine: ``Hardware.link`` repeats the
last axis's figures for them. On a ``Machine`` the link is the level the group's ranks span (inside a
node or across nodes), whatever mesh axis the group belongs to: the physical mesh prices the logical one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..boxing.kinds import kind_of
from ..hardware import Hardware
from ..machine import Machine
from ..ops.registry import TensorMeta
from ..runtime.specs import Actor, Collective, Send
from .shapes import ActorShapes, nbytes
from .sim_errors import SimulationError


@dataclass(frozen=True)
class CommInfo:
    """One communication firing as a boxing kind sees it.

    kind: all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | send_recv.
    mesh_axis: the mesh axis a collective runs on; None for point-to-point moves.
    group_size: ranks taking part.
    bytes_sent: bytes this rank sends.
    group: the ranks taking part (a Machine picks the link level they span); () where unknown.
    """

    kind: str
    mesh_axis: int | None
    group_size: int
    bytes_sent: int
    group: tuple[int, ...] = ()


def _attr_bytes(v, rank: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, Mapping):
        return int(v.get(rank, max(v.values(), default=0)))
    return int(v)


def collective_output(a: Collective, rank: int, x: TensorMeta) -> TensorMeta:
    """The local output meta of collective ``a`` on ``rank`` for input ``x``, as its boxing kind says."""
    return TensorMeta(kind_of(a.kind_).actor_output_shape(a, a.group.index(rank), x.shape), x.dtype)


def _collective_bytes(a: Collective, rank: int, shapes: ActorShapes) -> int:
    x = shapes.inputs[0]
    item = nbytes(x) // x.numel if x.numel else 0
    return kind_of(a.kind_).actor_bytes(a, a.group.index(rank), x.shape, item)


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
        return CommInfo(a.kind_, axis, len(a.group), sent, tuple(a.group))
    metas = shapes.inputs if isinstance(a, Send) else shapes.outputs
    return CommInfo("send_recv", None, 2, sum(nbytes(m) for m in metas), (rank, a.peer))  # type: ignore[attr-defined]


def comm_duration(info: CommInfo, hw: Hardware, busy: bool = False) -> float:
    """Seconds one communication firing takes on ``hw``: its boxing kind's duration (alpha-beta,
    measured fits first); ``busy``: while every core of the machine computes."""
    if info.group_size <= 1:
        return 0.0
    kind = kind_of(info.kind)
    if isinstance(hw, Machine) and info.group:  # the link follows from the ranks, not the mesh axis
        alpha, bw = hw.collective_alpha_beta(info.kind, info.mesh_axis, info.group, busy)
        return float(alpha * kind.rounds(info.group_size) + info.bytes_sent / bw)
    return float(kind.duration(hw, info.mesh_axis, info.group_size, info.bytes_sent, busy=busy))
