"""One-axis boxing steps: which collective turns SBP ``a`` into ``b`` on one mesh axis, when that is
valid inside an n-D SBP, and exactly how many bytes every rank sends and receives.

Everything here works on mesh coordinates (flat row-major index), not rank ids, so a route found for
one 2x2 mesh is reused for every 2x2 mesh. Bytes are exact for uneven splits, for ring algorithms:

- all-gather: chunk c starts at its owner and travels p-1 hops, so rank i sends every chunk but the
  next rank's (T - c[i+1]) and receives every chunk but its own (T - c[i]);
- reduce-scatter (the mirror image): rank i sends T - c[i], receives T - c[i-1];
- all-reduce: a reduce-scatter then an all-gather over a balanced chunking of the flat piece;
- all-to-all: exactly the blocks that change owner.

T is the logical size of the piece a group works on: the tensor after the other mesh axes' splits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from ..cluster import Cluster
from ..layout import LayoutError, balanced_sizes, check_layout
from ..placement import Placement
from ..sbp import B, Broadcast, NdSbp, Partial, SbpParallel, Split


def transition_kind(a: SbpParallel, b: SbpParallel) -> str | None:
    """The step that turns ``a`` into ``b`` on one mesh axis (BRIEF's table), or None if there is none.

    ``P(x) -> P(y)`` with x != y has no direct step; a route goes through B.
    """
    if a == b:
        return None
    if isinstance(a, Broadcast):
        return "slice" if isinstance(b, Split) else "zero"
    if isinstance(a, Split):
        if isinstance(b, Broadcast):
            return "all_gather"
        return "zero" if isinstance(b, Partial) else "all_to_all"
    if isinstance(b, Partial):  # a is Partial with another op
        return None
    return "all_reduce" if isinstance(b, Broadcast) else "reduce_scatter"


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


def _numel(sizes: list[int]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


@dataclass(frozen=True)
class EdgeCost:
    """Cost of one step, per mesh coordinate (flat row-major index), in bytes."""

    kind: str
    sent: tuple[int, ...]
    recv: tuple[int, ...]
    ticks: int  # exact time in units of 1 / time_scale(cluster) seconds
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
    """(sent, received) elements of rank ``i`` of a ring collective over a piece of ``T`` elements.

    ``chunks`` are the per-rank chunk sizes (elements) of the split side.
    """
    if kind == "all_gather":
        return T - chunks[(i + 1) % p], T - chunks[i]
    if kind == "reduce_scatter":
        return T - chunks[i], T - chunks[(i - 1) % p]
    if kind == "all_reduce":
        c = balanced_sizes(T, p)
        return 2 * T - c[i] - c[(i + 1) % p], 2 * T - c[(i - 1) % p] - c[i]
    raise ValueError(f"{kind} is not a ring collective")


@lru_cache(maxsize=64)
def time_scale(cluster: Cluster) -> int:
    """Ticks per second such that every alpha-beta time on ``cluster`` is a whole number of ticks.

    Search keys add integer ticks: exact (a reduce-scatter plus an all-gather ties with an
    all-reduce, as the model says, and the tie-break on bytes then steps decides, not rounding noise)
    and much faster to add than Fractions.
    """
    dens = [Fraction(x).denominator for x in (*cluster.axis_latency, cluster.p2p_latency)]
    dens += [(1 / Fraction(x)).denominator
             for x in (*cluster.axis_bandwidth, cluster.p2p_bandwidth, cluster.mem_bandwidth)]
    return math.lcm(*dens)


def ticks(cluster: Cluster, latency: float, steps: int, nbytes: int, bandwidth: float) -> int:
    """``latency * steps + nbytes / bandwidth`` (Cluster.ring_time) in exact ticks of time_scale."""
    t = (Fraction(latency) * steps + Fraction(nbytes) / Fraction(bandwidth)) * time_scale(cluster)
    assert t.denominator == 1
    return t.numerator


RING_STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2, "all_to_all": 1}  # x (p - 1)


@lru_cache(maxsize=262144)
def edge_cost(shape: tuple[int, ...], mesh_shape: tuple[int, ...], state: NdSbp, axis: int,
              new: SbpParallel, itemsize: int, cluster: Cluster) -> EdgeCost | None:
    """Exact cost of changing ``state[axis]`` to ``new``; None if no valid one-axis step does it."""
    old = state[axis]
    kind = transition_kind(old, new)
    if kind is None or step_problem(state, axis, new) is not None:
        return None
    p = mesh_shape[axis]
    whole = state[:axis] + (B,) + state[axis + 1:]  # the group's piece
    split = old if isinstance(old, Split) else new if isinstance(new, Split) else None
    sent: list[int] = []
    recv: list[int] = []
    local_write = 0
    for coord in np.ndindex(*mesh_shape):
        i = coord[axis]
        piece = extents(shape, mesh_shape, whole, coord)
        T = _numel(piece)
        if kind in ("slice", "zero"):
            s = r = 0
            if kind == "zero" and (isinstance(old, Split) or (new.op == "sum" and i != 0)):
                local_write = max(local_write, T)
        elif kind == "all_to_all":
            D, D2 = piece[old.dim], piece[new.dim]
            rest = T // (D * D2)
            a, b = balanced_sizes(D, p), balanced_sizes(D2, p)
            s, r = rest * a[i] * (D2 - b[i]), rest * b[i] * (D - a[i])
        else:
            if split is not None:
                D = piece[split.dim]
                chunks = [T // D * c for c in balanced_sizes(D, p)]
            else:
                chunks = []
            s, r = ring_bytes(kind, p, i, T, chunks)
        sent.append(s * itemsize)
        recv.append(r * itemsize)
    if kind in RING_STEPS:
        bw, lat = cluster.link(axis)
        t = ticks(cluster, lat, RING_STEPS[kind] * (p - 1), max(max(sent), max(recv)), bw)
    else:
        t = ticks(cluster, 0.0, 0, local_write * itemsize, cluster.mem_bandwidth)
    op = old.op if isinstance(old, Partial) else new.op if isinstance(new, Partial) else None
    return EdgeCost(kind, tuple(sent), tuple(recv), t, t / time_scale(cluster), op)


def explain_step(kind: str, old: SbpParallel, new: SbpParallel, axis_label: str) -> str:
    """A one-line reason for a step, in the words of BRIEF's table."""
    if kind == "slice":
        return f"every rank on {axis_label} holds the whole piece and keeps only its {new!r} slice"
    if kind == "zero":
        if isinstance(old, Broadcast):
            if new.op == "sum":
                return f"the first rank on {axis_label} keeps the value, the others hold zeros (a {new!r} addend)"
            return f"every rank on {axis_label} keeps its copy, a valid {new!r} candidate"
        return f"each rank on {axis_label} puts its {old!r} slice into a tensor filled with the identity of {new.op}"
    if kind == "all_gather":
        return f"{old!r} -> B on {axis_label}: every rank needs the pieces of the others"
    if kind == "reduce_scatter":
        return f"{old!r} -> {new!r} on {axis_label}: reduce the partial values, each rank keeps its slice"
    if kind == "all_reduce":
        return f"{old!r} -> B on {axis_label}: reduce the partial values everywhere"
    return f"{old!r} -> {new!r} on {axis_label}: exchange blocks so the split moves to dim {new.dim}"
