"""Lower bounds on boxing times, without a route search: what a bound on a stage space may charge an
edge before its real prices (``box_prices.py``, one Dijkstra per source layout) are worth paying for.

A route is a sequence of one-axis steps, and its time is the sum of theirs. The steps on mesh axis
``a`` alone turn ``src[a]`` into ``dst[a]``, so the route costs at least, summed over the axes, the
cheapest walk from ``src[a]`` to ``dst[a]`` over single entries (S(d), B, P(op)), each step priced at
its floor:

- its kinds' latency rounds in full (a collective on a group of ``p`` pays them whatever it moves);
- its bytes at ``StepKind.busy_floor`` of the smallest piece the busiest group could work on: the
  tensor split by every other axis, ``ceil(numel / prod(other axes))`` elements;
- local kinds (slices, zero fills) free, as ``BoxTable`` counts a local change.

``FloorBoxes(latency_only=True)`` charges each step its latency rounds alone, no bytes: a floor under the
part of a route's time that does not shrink with the tensor, which a pipeline's micro-batch pays whole
every micro-batch (``Space.real_pre_floor``). Any route between two layouts, at any size of the tensor
its states fit, pays at least that much.

Each step's floor is worked out in the route search's exact ticks (``boxing/ticks.py``) and rounded
once to seconds; the sums then shave a relative 1e-9 off, so float order never lifts a floor above the
price the search pays. The step kinds, their rounds and link figures are the planner's own
(``costs.step_kinds``, ``ticks.kind_rate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from ..boxing.costs import step_kinds
from ..boxing.state_graph import candidates
from ..boxing.ticks import kind_rate, time_scale
from ..hardware import Hardware
from ..layout import numel
from ..ops.registry import TensorMeta
from ..placement import Placement
from ..sbp import REDUCE_OPS, NdSbp, SbpParallel

_SAFE = 1.0 - 1e-9  # seconds added in another order than the route search adds them


@lru_cache(maxsize=4096)
def _axis_walks(ndim: int, mesh_shape: tuple[int, ...], axis: int, itemsize: int, numel_: int,
                hw: Hardware, latency_only: bool = False,
                strided: tuple[SbpParallel, ...] = ()) -> tuple[dict[SbpParallel, int], np.ndarray]:
    """(entry -> index, seconds of the cheapest walk between every two entries) on mesh ``axis``; with
    ``latency_only``, of the walks' latency rounds alone (no bytes). ``strided``: the strided splits
    (``S(d, chunks=k)``) of the layouts asked about, entries too: the route search adds a caller's own,
    which step only to and from B and P (``costs.step_kinds``)."""
    entries = (*candidates(ndim, REDUCE_OPS), *strided)
    at = {x: n for n, x in enumerate(entries)}
    p = mesh_shape[axis]
    others = numel(mesh_shape) // p
    T = -(-numel_ // others)  # the busiest group's piece holds at least this many elements
    scale = time_scale(hw)
    n = len(entries)
    d = np.full((n, n), np.inf)
    np.fill_diagonal(d, 0.0)
    for i, old in enumerate(entries):
        for j, new in enumerate(entries):
            for kind in step_kinds(old, new) if i != j else ():
                rate = kind_rate(kind, hw, axis, p) if kind.moves_data else None
                busy = 0 if latency_only else kind.busy_floor(T, p) * itemsize
                ticks = 0 if rate is None else rate(kind.rounds(p), busy)
                d[i, j] = min(d[i, j], ticks / scale)  # exact ticks, one rounding to seconds
    for k in range(n):  # Floyd-Warshall over a handful of entries
        d = np.minimum(d, d[:, k:k + 1] + d[k:k + 1, :])
    d[np.isinf(d)] = 0.0  # no walk: the planner speaks for such a pair, and 0 is below whatever it says
    return at, d * _SAFE


class FloorBoxes:
    """``BoxPrices``' face (``for_mesh``) with floors for prices: a ``Pricer`` built on it prices edges low
    (``latency_only``: at their routes' latency rounds alone, see the module docstring)."""

    def __init__(self, latency_only: bool = False) -> None:
        self.latency_only = latency_only

    def for_mesh(self, placement: Placement, hw: Hardware) -> MeshFloors:
        return MeshFloors(placement, hw, self.latency_only)

    def compute_times(self, mesh_shape: tuple[int, ...]) -> dict[tuple, float]:
        return {}  # a floor prices edges, no op


class MeshFloors:
    """Floors of every boxing on one mesh shape and hardware view (``MeshBoxes``' face)."""

    def __init__(self, placement: Placement, hw: Hardware, latency_only: bool = False) -> None:
        self.mesh_shape, self.hw, self.latency_only = placement.shape, hw, latency_only

    def matrix(self, meta: TensorMeta, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp]) -> np.ndarray:
        """A floor under ``BoxTable.time(src, dst)`` for every pair [srcs, dsts], in seconds."""
        out = np.zeros((len(srcs), len(dsts)))
        for a in range(len(self.mesh_shape)):
            strided = tuple(sorted({x[a] for x in (*srcs, *dsts) if getattr(x[a], "chunks", 1) > 1}, key=repr))
            if self.latency_only:  # no bytes: every tensor of this rank shares one table
                at, d = _axis_walks(len(meta.shape), self.mesh_shape, a, 1, 1, self.hw, True, strided)
            else:
                at, d = _axis_walks(len(meta.shape), self.mesh_shape, a, meta.dtype.itemsize, numel(meta.shape),
                                    self.hw, False, strided)
            rows = np.array([at[s[a]] for s in srcs], dtype=np.int64)
            cols = np.array([at[t[a]] for t in dsts], dtype=np.int64)
            out += d[np.ix_(rows, cols)]
        return out

    def time(self, meta: TensorMeta, src: NdSbp, dst: NdSbp) -> float:
        return float(self.matrix(meta, [src], [dst])[0, 0])

    def bucketable_latency(self, meta: TensorMeta, src: NdSbp, dst: NdSbp) -> float:
        """All of the floor: a gradient's bucket share of it (``Pricer.grad_reduce_time``) is then below
        the real reduction's price, whose own latency is at most its whole time."""
        return self.time(meta, src, dst)
