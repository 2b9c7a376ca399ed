"""One-axis boxing steps: which kinds turn SBP ``a`` into ``b`` on one mesh axis, when that is valid
inside an n-D SBP, and exactly how many bytes every rank sends and receives.

Everything here works on mesh coordinates (flat row-major index), not rank ids, so a route found for
one 2x2 mesh is reused for every 2x2 mesh. The arithmetic of each step (its bytes per rank, its
alpha-beta time) belongs to its kind (``kinds/``); this module walks the mesh coordinates, hands each
kind the logical piece ``T`` its group works on (the tensor after the other mesh axes' splits) and
turns the kind's time into exact integer ticks for the route search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from ..hardware import Hardware
from ..layout import LayoutError, check_layout
from ..placement import Placement
from ..sbp import B, NdSbp, Partial, SbpParallel, Split
from .kinds import KINDS, StepKind, kind_of, kinds_between, on_change


def transition_kind(a: SbpParallel, b: SbpParallel) -> str | None:
    """The first kind that turns ``a`` into ``b`` on one mesh axis (BRIEF's table), or None.

    ``P(x) -> P(y)`` with x != y has no direct step; a route goes through B.
    """
    found = kinds_between(a, b)
    return found[0].name if found else None


def step_problem(state: NdSbp, axis: int, new: SbpParallel) -> str | None:
    """Why changing ``state[axis]`` to ``new`` with a local collective would be wrong, or None if fine.

    Split pieces only nest one way: mesh axis k splits what axes < k left. If a later axis j > k also
    splits dim d, the pieces a group on axis k holds are not contiguous slices of one parent, so
    gathering, slicing or exchanging them along d on axis k alone puts data in the wrong place.
    Reductions must happen innermost first: the value of ``(P(sum), P(max))`` is a sum of maxima, so
    reducing axis k is only right if every later partial axis reduces with the same (commuting) op.
    """
    old = state[axis]
    for x in (old, new):
        if isinstance(x, Split):
            for j in range(axis + 1, len(state)):
                if state[j] == x:
                    return (f"mesh axis {j} also splits dim {x.dim} after axis {axis}, so the pieces on "
                            f"axis {axis} do not nest")
    if isinstance(old, Partial) and not isinstance(new, Partial):
        for j in range(axis + 1, len(state)):
            y = state[j]
            if isinstance(y, Partial) and y.op != old.op:
                return (f"mesh axis {j} holds {y!r} inside the {old!r} of axis {axis}; "
                        f"reduce axis {j} first")
    return None


@lru_cache(maxsize=64)
def canonical_placement(mesh_shape: tuple[int, ...]) -> Placement:
    return Placement("cpu", np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape).tolist())


@lru_cache(maxsize=65536)
def state_ok(shape: tuple[int, ...], mesh_shape: tuple[int, ...], state: NdSbp) -> bool:
    """True when every rank gets a non-empty piece (check_layout passes)."""
    try:
        check_layout(shape, canonical_placement(mesh_shape), state)
    except LayoutError:
        return False
    return True


def extents(shape: tuple[int, ...], mesh_shape: tuple[int, ...], state: NdSbp,
            coord: tuple[int, ...]) -> list[int]:
    """Local shape at mesh coordinate ``coord`` (sizes only; same arithmetic as layout.local_block)."""
    sizes = list(shape)
    for axis, x in enumerate(state):
        if isinstance(x, Split):
            q, r = divmod(sizes[x.dim], mesh_shape[axis])
            sizes[x.dim] = q + (1 if coord[axis] < r else 0)
    return sizes




@dataclass(frozen=True)
class EdgeCost:
    """Cost of one step, per mesh coordinate (flat row-major index), in bytes."""

    kind: str
    sent: tuple[int, ...]
    recv: tuple[int, ...]
    ticks: int  # exact time in units of 1 / time_scale(hardware) seconds
    time_s: float
    reduce_op: str | None

    @property
    def total(self) -> int:
        return sum(self.sent)

    @property
    def key(self) -> tuple[int, int, int]:
        """Search key: time, then bytes sent by all ranks, then one step."""
        return (self.ticks, self.total, 1)


def ring_bytes(kind: str, p: int, i: int, T: int, chunks: list[int]) -> tuple[int, int]:
    """(sent, received) elements of rank ``i`` of a ring collective over a piece of ``T`` elements
    (the kind's own arithmetic; ``chunks`` are the per-rank chunk sizes of the split side)."""
    k = kind_of(kind)
    if not hasattr(k, "ring_elements"):
        raise ValueError(f"{kind} is not a ring collective")
    return k.ring_elements(p, i, T, chunks)  # type: ignore[attr-defined]


RING_STEPS = {name: k.rounds(2) for name, k in KINDS.items() if k.is_collective}  # x (p - 1)


@lru_cache(maxsize=64)
def time_scale(hardware: Hardware) -> int:
    """Ticks per second such that every alpha-beta time on ``hardware`` is a whole number of ticks.

    Search keys add integer ticks: exact (a reduce-scatter plus an all-gather ties with an
    all-reduce, as the model says, and the tie-break on bytes then steps decides, not rounding noise)
    and much faster to add than Fractions. Measured per-kind fits count too.
    """
    lats = [*hardware.axis_latency, hardware.p2p_latency, *(f.alpha for f in hardware.comm_fits)]
    bws = [*hardware.axis_bandwidth, hardware.p2p_bandwidth, hardware.mem_bandwidth,
           *(f.bandwidth for f in hardware.comm_fits)]
    dens = [Fraction(x).denominator for x in lats] + [(1 / Fraction(x)).denominator for x in bws]
    return math.lcm(*dens)


def ticks(hardware: Hardware, latency: float, steps: int, nbytes: int, bandwidth: float) -> int:
    """``latency * steps + nbytes / bandwidth`` (Hardware.ring_time) in exact ticks of time_scale."""
    t = (Fraction(latency) * steps + Fraction(nbytes) / Fraction(bandwidth)) * time_scale(hardware)
    assert t.denominator == 1
    return t.numerator


def kind_ticks(kind: StepKind, hardware: Hardware, axis: int | None, group_size: int, nbytes: int,
               messages: int = 1) -> int:
    """``kind.duration(...)`` in exact ticks: the same alpha-beta figures, added without rounding."""
    if kind.moves_data and group_size <= 1:
        return 0
    alpha, bw = kind.alpha_beta(hardware, axis, group_size)
    return ticks(hardware, alpha, kind.rounds(group_size, messages), nbytes, bw)


def _kind_cost(kind: StepKind, shape, mesh_shape, whole: NdSbp, axis: int, old: SbpParallel,
               new: SbpParallel, itemsize: int, hardware: Hardware) -> EdgeCost:
    sent, recv, busy = _kind_bytes(kind, shape, mesh_shape, whole, axis, old, new, itemsize)
    t = kind_ticks(kind, hardware, axis, mesh_shape[axis], busy)
    op = old.op if isinstance(old, Partial) else new.op if isinstance(new, Partial) else None
    return EdgeCost(kind.name, sent, recv, t, t / time_scale(hardware), op)


@lru_cache(maxsize=65536)
def _kind_bytes(kind: StepKind, shape, mesh_shape, whole: NdSbp, axis: int, old: SbpParallel,
                new: SbpParallel, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(bytes sent, bytes received per mesh coordinate, the busiest one's bytes) of one kind's step: no
    hardware in it, so every hardware view of a mesh shape (links mapped either way) shares it."""
    p = mesh_shape[axis]
    # a coordinate's piece depends only on the axes that split it, its bytes on that and its place on
    # ``axis``: each distinct one is asked once, then spread over the mesh (row-major, as np.ndindex)
    rel = [a for a, x in enumerate(whole) if a == axis or isinstance(x, Split)]
    per = np.zeros([mesh_shape[a] if a in rel else 1 for a in range(len(mesh_shape))] + [3], dtype=np.int64)
    for coord in np.ndindex(*per.shape[:-1]):
        per[coord] = kind.rank_elements(extents(shape, mesh_shape, whole, coord), old, new, p, coord[axis])
    every = np.broadcast_to(per, tuple(mesh_shape) + (3,)).reshape(-1, 3) * itemsize
    return tuple(every[:, 0].tolist()), tuple(every[:, 1].tolist()), int(every[:, 2].max())


@lru_cache(maxsize=262144)
def edge_cost(shape: tuple[int, ...], mesh_shape: tuple[int, ...], state: NdSbp, axis: int,
              new: SbpParallel, itemsize: int, hardware: Hardware) -> EdgeCost | None:
    """Exact cost of changing ``state[axis]`` to ``new`` with the cheapest kind that does it; None if
    no valid one-axis step does it."""
    old = state[axis]
    kinds = kinds_between(old, new)
    if not kinds or step_problem(state, axis, new) is not None:
        return None
    whole = state[:axis] + (B,) + state[axis + 1:]  # the group's piece
    costs = [_kind_cost(k, shape, mesh_shape, whole, axis, old, new, itemsize, hardware) for k in kinds]
    return min(costs, key=lambda c: c.key)


def explain_step(kind: str, old: SbpParallel, new: SbpParallel, axis_label: str) -> str:
    """A one-line reason for a step, in the words of BRIEF's table (the kind's own words)."""
    return kind_of(kind).explain(old, new, axis_label)


on_change(edge_cost.cache_clear)
on_change(_kind_bytes.cache_clear)
