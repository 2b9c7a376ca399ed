"""One-axis boxing steps: which kinds turn SBP ``a`` into ``b`` on one mesh axis, when that is valid
inside an n-D SBP, and exactly how many bytes every rank sends and receives.

Everything here works on mesh coordinates (flat row-major index), not rank ids, so a route found for
one 2x2 mesh is reused for every 2x2 mesh. The arithmetic of each step (its bytes per rank, its
alpha-beta time) belongs to its kind (``kinds/``); this module walks the mesh coordinates, hands each
kind the logical piece ``T`` its group works on (the tensor after the other mesh axes' splits) and
turns the kind's time into exact integer ticks for the route search.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..hardware import Hardware
from ..layout import LayoutError, check_layout, numel
from ..placement import Placement
from ..sbp import NdSbp, Partial, SbpParallel, Split
from .kinds import KINDS, StepKind, kind_of, kinds_between, on_change
from .ticks import kind_rate, time_scale


def transition_kind(a: SbpParallel, b: SbpParallel) -> str | None:
    """The first kind that turns ``a`` into ``b`` on one mesh axis (BRIEF's table), or None.

    ``P(x) -> P(y)`` with x != y has no direct step; a route goes through B.
    """
    found = step_kinds(a, b)
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
    return _piece_extents(shape, mesh_shape, piece_splits(state, -1), coord)




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


@lru_cache(maxsize=1024)
def step_kinds(old: SbpParallel, new: SbpParallel) -> tuple[StepKind, ...]:
    """``kinds_between``, asked once per pair: every priced step asks it. A strided split
    (``S(d, chunks=k)``) moves only to and from B and P on its axis: an all-gather then a local reorder of
    the chunks (S -> B), a local slice per chunk (B -> S), a local reorder then a reduce-scatter (P -> S),
    its pieces into a buffer of the identity (S -> P); to another split it goes through B."""
    return kinds_between(old, new)


def piece_splits(state: NdSbp, axis: int) -> tuple:
    """The dim each mesh axis splits in the piece a group on ``axis`` works on (-1: no split; ``axis``
    itself reads as B; ``(dim, k)`` for a strided split ``S(dim, chunks=k)``): all of a layout that a step's bytes depend on besides the step itself."""
    return tuple([-1 if a == axis or not isinstance(x, Split) else x.dim if x.chunks == 1 else (x.dim, x.chunks)
                  for a, x in enumerate(state)])


def _piece_extents(shape: tuple[int, ...], mesh_shape: tuple[int, ...], splits: tuple[int, ...],
                   coord: tuple[int, ...]) -> list[int]:
    """``extents`` of a layout whose splits are ``splits`` (``piece_splits``)."""
    sizes = list(shape)
    for axis, d in enumerate(splits):
        if isinstance(d, tuple):  # a strided split (dim, k): its piece of each of k chunks
            d, k = d
            q, r = divmod(sizes[d] // k, mesh_shape[axis])
            sizes[d] = k * (q + (1 if coord[axis] < r else 0))
        elif d != -1:
            q, r = divmod(sizes[d], mesh_shape[axis])
            sizes[d] = q + (1 if coord[axis] < r else 0)
    return sizes


@lru_cache(maxsize=65536)
def _kind_bytes(kind: StepKind, shape, mesh_shape, splits: tuple[int, ...], axis: int, old: SbpParallel,
                new: SbpParallel, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """(bytes sent, bytes received per mesh coordinate, the busiest one's bytes, bytes sent by all) of
    one kind's step on the piece ``splits`` describes (``piece_splits``): no hardware in it, so every
    hardware view of a mesh shape (links mapped either way) shares it, and ints as its key, cheap to
    hash."""
    p = mesh_shape[axis]
    # a coordinate's piece depends only on the axes that split it (and on none when they all split
    # evenly), its bytes on that and its place on ``axis``: each distinct one is asked once, then spread
    # over the mesh in row-major order (the other axes' coordinates read as 0)
    sizes, even = list(shape), True
    for a, d in enumerate(splits):
        if isinstance(d, tuple):  # a strided split: even when each chunk splits evenly
            d, k = d
            even = even and sizes[d] // k % mesh_shape[a] == 0
            sizes[d] //= mesh_shape[a]
        elif d != -1:
            even = even and sizes[d] % mesh_shape[a] == 0
            sizes[d] //= mesh_shape[a]
    spans = [range(n) if a == axis or (splits[a] != -1 and not even) else (0,) * n
             for a, n in enumerate(mesh_shape)]
    if even:  # every coordinate holds the same piece: its group's members' elements, shared by every
        # tensor and mesh whose groups on ``axis`` work on that piece (a micro-batch's, a stage mesh's)
        row = _group_elements(kind, tuple(_piece_extents(shape, mesh_shape, splits, (0,) * len(mesh_shape))), old,
                              new, p)
        every = [row[c[axis]] for c in itertools.product(*spans)]
        sent = tuple(x[0] * itemsize for x in every)
        return sent, tuple(x[1] * itemsize for x in every), max(x[2] for x in every) * itemsize, sum(sent)
    per: dict[tuple[int, ...], tuple[int, int, int]] = {}
    seen: dict[tuple, tuple[int, int, int]] = {}  # (piece, place on ``axis``): even splits leave few distinct
    for coord in itertools.product(*(sorted(set(s)) for s in spans)):
        key = (tuple(_piece_extents(shape, mesh_shape, splits, coord)), coord[axis])
        got = seen.get(key)
        if got is None:
            got = seen[key] = kind.rank_elements(key[0], old, new, p, coord[axis])
        per[coord] = got
    every = [per[c] for c in itertools.product(*spans)]
    sent = tuple(x[0] * itemsize for x in every)
    return sent, tuple(x[1] * itemsize for x in every), max(x[2] for x in every) * itemsize, sum(sent)


@lru_cache(maxsize=65536)
def _kind_load(kind: StepKind, shape, mesh_shape, splits: tuple[int, ...], axis: int, old: SbpParallel,
               new: SbpParallel, itemsize: int) -> tuple[int, int]:
    """(the busiest coordinate's bytes, bytes sent by all) of ``_kind_bytes``: all a route search's key
    needs. Where the other axes split evenly every group works on the same piece, so both come from one
    group's members without listing every coordinate of the mesh."""
    sizes = list(shape)
    for a, d in enumerate(splits):  # the test ``_kind_bytes`` makes, in its order
        if isinstance(d, tuple):
            d, k = d
            if sizes[d] // k % mesh_shape[a]:
                break
            sizes[d] //= mesh_shape[a]
        elif d != -1:
            if sizes[d] % mesh_shape[a]:
                break
            sizes[d] //= mesh_shape[a]
    else:  # even: as ``_kind_bytes`` has it, each of the size / p groups sends what this one does
        row = _group_elements(kind, tuple(_piece_extents(shape, mesh_shape, splits, (0,) * len(mesh_shape))), old,
                              new, mesh_shape[axis])
        groups = numel(mesh_shape) // mesh_shape[axis]
        return max(x[2] for x in row) * itemsize, groups * sum(x[0] * itemsize for x in row)
    return _kind_bytes(kind, shape, mesh_shape, splits, axis, old, new, itemsize)[2:]


@lru_cache(maxsize=65536)
def _group_elements(kind: StepKind, piece: tuple[int, ...], old: SbpParallel, new: SbpParallel,
                    p: int) -> tuple[tuple[int, int, int], ...]:
    """``kind.rank_elements`` of each member of a group of ``p`` working on ``piece``: what a step's bytes
    depend on (the kind's own arithmetic), whatever tensor and mesh the piece came from."""
    return tuple(kind.rank_elements(piece, old, new, p, i) for i in range(p))


def step_rates(kinds: tuple[StepKind, ...], hardware: Hardware, axis: int,
               group_size: int) -> tuple[tuple[int, int] | None, ...]:
    """Per kind, in the order of ``kinds``: (ticks of its latency rounds, ticks per byte) on mesh
    ``axis`` for a group of ``group_size`` (``ticks.kind_rate``), or None where it takes no time."""
    out: list[tuple[int, int] | None] = []
    for k in kinds:
        rate = kind_rate(k, hardware, axis, group_size)
        out.append(None if rate is None else (rate.per_round * k.rounds(group_size), rate.per_byte))
    return tuple(out)


def cheapest(shape: tuple[int, ...], mesh_shape: tuple[int, ...], splits: tuple[int, ...], axis: int,
             old: SbpParallel, new: SbpParallel, itemsize: int, kinds: tuple[StepKind, ...],
             rates: tuple[tuple[int, int] | None, ...]) -> tuple[tuple[int, int, int], int]:
    """(search key, index in ``kinds``) of the cheapest kind turning ``old`` into ``new`` on ``axis`` of a
    layout with ``piece_splits`` ``splits`` (``rates``: ``step_rates`` of ``kinds``): least time, then
    bytes sent by all ranks; the first kind wins a tie (registration order). Plain integers: a search
    prices every step it relaxes this way and builds no ``EdgeCost``."""
    best: tuple[int, int, int] | None = None
    at = 0
    for n, kind in enumerate(kinds):
        busy, total = _kind_load(kind, shape, mesh_shape, splits, axis, old, new, itemsize)
        rate = rates[n]  # TickRate(rounds, busy), its rounds already counted
        key = (0 if rate is None else rate[0] + busy * rate[1], total, 1)
        if best is None or key < best:
            best, at = key, n
    assert best is not None
    return best, at


@lru_cache(maxsize=262144)
def edge_cost(shape: tuple[int, ...], mesh_shape: tuple[int, ...], state: NdSbp, axis: int,
              new: SbpParallel, itemsize: int, hardware: Hardware) -> EdgeCost | None:
    """Exact cost of changing ``state[axis]`` to ``new`` with the cheapest kind that does it; None if
    no valid one-axis step does it."""
    old = state[axis]
    kinds = step_kinds(old, new)
    if not kinds or step_problem(state, axis, new) is not None:
        return None
    splits = piece_splits(state, axis)
    key, at = cheapest(shape, mesh_shape, splits, axis, old, new, itemsize, kinds,
                       step_rates(kinds, hardware, axis, mesh_shape[axis]))
    kind = kinds[at]
    sent, recv, _, _ = _kind_bytes(kind, shape, mesh_shape, splits, axis, old, new, itemsize)
    op = old.op if isinstance(old, Partial) else new.op if isinstance(new, Partial) else None
    return EdgeCost(kind.name, sent, recv, key[0], key[0] / time_scale(hardware), op)


def explain_step(kind: str, old: SbpParallel, new: SbpParallel, axis_label: str) -> str:
    """A one-line reason for a step, in the words of BRIEF's table (the kind's own words)."""
    return kind_of(kind).explain(old, new, axis_label)


on_change(edge_cost.cache_clear)
on_change(step_kinds.cache_clear)
on_change(_kind_bytes.cache_clear)
on_change(_group_elements.cache_clear)
on_change(_kind_load.cache_clear)
