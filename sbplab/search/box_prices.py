"""Boxing prices for the search: one table per (tensor shape, dtype size, mesh shape, hardware view).

Pricing a search space asks "how long does turning layout ``src`` into ``dst`` take?" hundreds of
thousands of times: every pair of signatures on every edge, every parameter's gradient sync, on every
mesh and micro-batch size. ``plan_boxing`` answers one pair at a time (validation, a Dijkstra that
stops at ``dst``, a plan that names real ranks). The search needs only the seconds, and asks about
many destinations from the same source, so a table here runs the planner's Dijkstra once per source
layout (``seconds_from``: over the very state graph ``find_route`` searches, without stopping at one
target) and reads every destination off it. The seconds of a route are summed step by step, as
``BoxingPlan.time_s`` sums its steps, so a price is the plan's ``time_s``.

The tables depend only on their key (not on which ranks the mesh holds, nor on the op), so identical
layers, ZeRO levels and every mesh of the same shape and links share them; a search keeps one
``BoxPrices`` for all its meshes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from ..boxing import plan_boxing
from ..boxing.costs import edge_cost, state_ok
from ..boxing.kinds import kind_of
from ..boxing.route import BoxingError, Route, apply_hops, partial_ops, routes_from, seconds_from
from ..boxing.state_graph import StateGraph, state_graph
from ..compiler.deduction.deduce import is_local_change
from ..hardware import Hardware
from ..layout import LayoutError
from ..ops.registry import TensorMeta
from ..placement import Placement
from ..sbp import REDUCE_OPS, Broadcast, NdSbp, Partial, Split


@lru_cache(maxsize=4096)
def local_targets(src: NdSbp, tensor_ndim: int) -> tuple[NdSbp, ...]:
    """Every layout ``is_local_change`` lets ``src`` become (a slice or zero fill on every rank): each
    axis keeps its entry, or goes B -> S(d) or P, or S(d) -> P; the nesting rule then filters them."""
    partials = tuple(Partial(op) for op in REDUCE_OPS)
    options = [(x, *(partials + tuple(Split(d) for d in range(tensor_ndim)) if isinstance(x, Broadcast)
                     else partials if isinstance(x, Split) else ())) for x in src]
    return tuple(dst for dst in itertools.product(*options) if dst != src and is_local_change(src, dst))


class BoxTable:
    """Seconds of every boxing of one tensor (shape and dtype) on one mesh, computed on first use."""

    def __init__(self, meta: TensorMeta, placement: Placement, hw: Hardware) -> None:
        self.meta, self.placement, self.hw = meta, placement, hw
        self.shape, self.mesh_shape, self.itemsize = tuple(meta.shape), placement.shape, meta.dtype.itemsize
        self._times: dict[tuple[NdSbp, NdSbp], float] = {}
        self._latencies: dict[tuple[NdSbp, NdSbp], float] = {}
        self._routes: dict[tuple[NdSbp, tuple[str, ...]], dict[NdSbp, Route]] = {}  # (source, reduce ops)
        self._graphs: dict[tuple[str, ...], StateGraph] = {}  # held: the planner's cache is bounded
        self._rows: dict[tuple[NdSbp, tuple[str, ...]], dict[NdSbp, float]] = {}  # (source, reduce ops)

    def time(self, src: NdSbp, dst: NdSbp) -> float:
        """Seconds of the cheapest boxing from ``src`` to ``dst`` (0 for a local slice or fill)."""
        key = (src, dst)
        t = self._times.get(key)
        if t is None:
            t = self._times[key] = self._price(src, dst)
        return t

    def matrix(self, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp]) -> np.ndarray:
        """``time(src, dst)`` for every pair [srcs, dsts], read off one row per source and reduce ops."""
        out = np.empty((len(srcs), len(dsts)))
        groups: dict[tuple[str, ...], list[tuple[int, NdSbp]]] = {}  # the destinations by their own reduce ops
        for c, dst in enumerate(dsts):
            groups.setdefault(partial_ops(dst), []).append((c, dst))
        for r, src in enumerate(srcs):
            src_ops = partial_ops(src)
            for own, cols in groups.items():  # partial_ops(src, dst), per group
                row = self._row(src, own if own == src_ops else tuple(sorted({*src_ops, *own})))
                for c, dst in cols:
                    t = row.get(dst)
                    out[r, c] = self.time(src, dst) if t is None else t
        return out

    def _row(self, src: NdSbp, ops: tuple[str, ...]) -> dict[NdSbp, float]:
        """``time(src, dst)`` for every ``dst`` with ``partial_ops(src, dst) == ops`` that the route search
        from ``src`` reaches; the rest (layouts that do not fit, unreachable ones) are asked of ``time``."""
        row = self._rows.get((src, ops))
        if row is None:
            row = {}
            if state_ok(self.shape, self.mesh_shape, src):  # the planner's Dijkstra, not stopping at one target
                g = self._graphs.get(ops)
                if g is None:
                    g = self._graphs[ops] = state_graph(self.shape, self.mesh_shape, self.itemsize, self.hw, ops)
                row = seconds_from(g, src)
                local = [dst for dst in local_targets(src, len(self.shape)) if row.get(dst, 0.0) != 0.0]
                if local:  # counted free, as ``time`` does
                    row.update(dict.fromkeys(local, 0.0))
            self._rows[(src, ops)] = row
        return row

    def bucketable_latency(self, src: NdSbp, dst: NdSbp) -> float:
        """The latency part (alpha x rounds) of the steps of ``time(src, dst)``'s route whose kind can run
        in a gradient bucket (``StepKind.bucket_layout``): the part a bucket pays once for all its members."""
        key = (src, dst)
        t = self._latencies.get(key)
        if t is None:
            t = 0.0
            for (axis, _), _, cost in self._steps(src, dst) or ():
                kind, p = kind_of(cost.kind), self.mesh_shape[axis]
                if kind.bucket_layout is not None and p > 1:
                    t += kind.alpha_beta(self.hw, axis, p)[0] * kind.rounds(p)
            self._latencies[key] = t
        return t

    def _steps(self, src: NdSbp, dst: NdSbp) -> list | None:
        """((axis, new), state before, EdgeCost) of every step of the cheapest route ([] for a local
        change), or None where the route search has no answer and the planner must speak."""
        if src == dst or is_local_change(src, dst):
            return []
        shape, mesh, itemsize, hw = self.shape, self.mesh_shape, self.itemsize, self.hw
        if not (state_ok(shape, mesh, src) and state_ok(shape, mesh, dst)):
            return None  # the planner raises its error for a layout that does not fit
        ops = partial_ops(src, dst)
        routes = self._routes.get((src, ops))
        if routes is None:  # the planner's Dijkstra from ``src``, not stopping at one target
            routes = self._routes[(src, ops)] = routes_from(shape, src, mesh, itemsize, hw, ops)
        route = routes.get(dst)
        if route is None:
            return None  # unreachable: the planner says why
        return [(hop, s, edge_cost(shape, mesh, s, hop[0], hop[1], itemsize, hw))
                for hop, s in zip(route.hops, apply_hops(src, route.hops))]

    def _price(self, src: NdSbp, dst: NdSbp) -> float:
        t = self._row(src, partial_ops(src, dst)).get(dst)
        return self._planned(src, dst) if t is None else t  # no route: the planner answers, or says why

    def _planned(self, src: NdSbp, dst: NdSbp) -> float:
        if _strided(src) or _strided(dst):  # no collective moves a strided split: the pair is never taken
            try:
                return plan_boxing(self.shape, src, dst, self.placement, None, dtype=self.meta.dtype,
                                   hardware=self.hw).time_s
            except (BoxingError, LayoutError):  # no route, or a strided split that cannot share its dim
                return UNREACHABLE_S
        return plan_boxing(self.shape, src, dst, self.placement, None, dtype=self.meta.dtype, hardware=self.hw).time_s


UNREACHABLE_S = 3600.0  # the price of a boxing no route makes: an hour a step, beyond any strategy's time


def _strided(nd: NdSbp) -> bool:
    """A strided split (``S(d, chunks=k)``, a fused layer's layout) that only ops make and read."""
    return any(getattr(x, "chunks", 1) > 1 for x in nd)


class BoxPrices:
    """Every ``BoxTable`` of one search, keyed by mesh shape and hardware view, then by tensor; and the
    ops' compute times per mesh shape (``Pricer.compute_time``), which no link mapping changes."""

    def __init__(self) -> None:
        self._meshes: dict[tuple[tuple[int, ...], Hardware], dict[TensorMeta, BoxTable]] = {}
        self._compute: dict[tuple[int, ...], dict[tuple, float]] = {}

    def for_mesh(self, placement: Placement, hw: Hardware) -> MeshBoxes:
        tables = self._meshes.setdefault((placement.shape, hw), {})
        return MeshBoxes(tables, placement, hw)

    def compute_times(self, mesh_shape: tuple[int, ...]) -> dict[tuple, float]:
        return self._compute.setdefault(mesh_shape, {})


class MeshBoxes:
    """The tables of one mesh shape and hardware view (shared with every mesh of the same key)."""

    def __init__(self, tables: dict[TensorMeta, BoxTable], placement: Placement, hw: Hardware) -> None:
        self._tables, self.placement, self.hw = tables, placement, hw

    def table(self, meta: TensorMeta) -> BoxTable:
        t = self._tables.get(meta)
        if t is None:
            t = self._tables[meta] = BoxTable(meta, self.placement, self.hw)
        return t

    def time(self, meta: TensorMeta, src: NdSbp, dst: NdSbp) -> float:
        return self.table(meta).time(src, dst)

    def matrix(self, meta: TensorMeta, srcs: Sequence[NdSbp], dsts: Sequence[NdSbp]) -> np.ndarray:
        return self.table(meta).matrix(srcs, dsts)

    def bucketable_latency(self, meta: TensorMeta, src: NdSbp, dst: NdSbp) -> float:
        return self.table(meta).bucketable_latency(src, dst)
