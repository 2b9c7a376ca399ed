"""A lower bound on a pipeline's step time over every assignment and cut of one stage space, from
its ops and the edges inside its layers, solved exactly on a forest.

A pipeline of S stages and M micro-batches takes (M + S - 1) x the slowest stage's time per
micro-batch, plus the slowest stage's once-per-step work (``pipeline.py``). The slowest stage is at
least the mean one, so, with R = M + S - 1, any assignment and cut costs at least

    ( sum over ops of  R (compute + gather) + sync   +   R x sum over edges inside a stage ) / S.

An edge inside a layer is inside a stage whatever the cut (cuts fall between layers), so every layer
adds at least the least cost of its own ops and internal edges; edges between layers may become
stage-to-stage moves and count 0. Within a layer the edges are thinned to a spanning forest (the
costliest first) and the forest is solved exactly by dynamic programming, leaf to root: dropping an
edge only lowers the bound. Identical layers share their price arrays, so each distinct layer is solved
once per ZeRO level.

With ``stages`` given, ``value`` also charges the stage-to-stage moves the cuts make: there are S - 1 cuts,
each at a distinct layer boundary, and a pipeline pays every edge crossing a cut its move (``cross_stage``)
instead of its in-mesh price, which the bound above counts as 0. An edge may cross several cuts and is
paid once, so each edge's least move is shared among the boundaries it spans: boundary c is charged
the sum, over the edges crossing it, of least move / boundaries spanned, and any S - 1 cuts cost at
least the S - 1 smallest such charges (each per micro-batch, so times ``rounds``).

``micro_edges`` prices a micro-batch graph's edges from the whole batch's before that graph is traced.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .pipeline import blocks_of
from .problem import Edge, OpSpace

_SAFE = 1.0 - 1e-9  # the charges are summed in another order than ``pipeline.price_stages`` sums the moves


@dataclass(frozen=True)
class _Tree:
    """One layer's ops (problem indices) and its forest, in an order where each op follows its parent."""

    ops: tuple[int, ...]
    order: tuple[int, ...]  # positions in ``ops``, roots first, each after its parent
    parent: tuple[tuple[int, np.ndarray] | None, ...]  # per position: (parent's, cost [own sigs, parent's sigs])
    count: int  # how many layers have exactly these prices


class StageFloor:
    """``value(zero, rounds)``: the bound above, before dividing by S (``rounds`` = M + S - 1)."""

    def __init__(self, ops: list[OpSpace], edges: list[Edge]) -> None:
        self.ops, self.edges = ops, edges
        blocks = blocks_of(ops)
        block_of = {k: b for b, ks in enumerate(blocks) for k in ks}
        inside: list[list[Edge]] = [[] for _ in blocks]
        for e in edges:
            if e.src != e.dst and block_of[e.src] == block_of[e.dst]:
                inside[block_of[e.src]].append(e)
        trees: dict[tuple, _Tree] = {}
        for ks, es in zip(blocks, inside):
            key = (tuple(id(ops[k].compute) for k in ks),  # one price table per distinct op (``op_prices.py``)
                   tuple((e.src - ks[0], e.dst - ks[0], id(e.cost)) for e in es))
            got = trees.get(key)
            trees[key] = _forest(ks, es) if got is None else _Tree(got.ops, got.order, got.parent, got.count + 1)
        self.trees = list(trees.values())
        charge = np.zeros(len(blocks))  # charge[c]: the least moves of a cut before block c
        for e in edges:
            a, b = sorted((block_of[e.src], block_of[e.dst]))
            if e.cross_stage is not None and a != b:
                charge[a + 1:b + 1] += float(e.cross_stage.min()) / (b - a)
        self.cut_charges = np.sort(charge[1:]) * _SAFE

    def cuts(self, stages: int) -> float:
        """The least stage-to-stage moves per micro-batch of any ``stages`` - 1 cuts (module docstring)."""
        return float(self.cut_charges[:stages - 1].sum())

    def value(self, zero: int, rounds: float, stages: int = 1) -> float:
        """The bound before dividing by S; ``stages``: with the moves of S - 1 cuts (module docstring)."""
        total = rounds * self.cuts(stages) if stages > 1 else 0.0
        for tree in self.trees:
            ops = [self.ops[k] for k in tree.ops]
            f = [rounds * (o.compute + o.gather[zero]) + o.sync[zero] for o in ops]
            low = 0.0
            for i in reversed(tree.order):  # leaves first: fold each op's best into its parent
                up = tree.parent[i]
                if up is None:
                    low += float(f[i].min())
                else:
                    at, cost = up
                    f[at] = f[at] + (rounds * cost + f[i][:, None]).min(axis=0)
            total += tree.count * low
        return total


def _forest(ks: list[int], es: list[Edge]) -> _Tree:
    """A spanning forest of one layer's edges, parallel edges summed, heaviest first (Kruskal)."""
    pos = {k: n for n, k in enumerate(ks)}
    pairs: dict[tuple[int, int], np.ndarray] = {}  # (a, b) with a < b -> cost [a sigs, b sigs]
    for e in es:
        a, b = pos[e.src], pos[e.dst]
        m = e.cost if a < b else e.cost.T
        key = (min(a, b), max(a, b))
        pairs[key] = pairs[key] + m if key in pairs else m
    root = list(range(len(ks)))

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    adj: list[list[tuple[int, np.ndarray]]] = [[] for _ in ks]  # neighbour, cost [own sigs, its sigs]
    for (a, b), m in sorted(pairs.items(), key=lambda kv: -float(kv[1].mean())):
        ra, rb = find(a), find(b)
        if ra != rb:
            root[ra] = rb
            adj[a].append((b, m))
            adj[b].append((a, m.T))
    order: list[int] = []
    parent: list[tuple[int, np.ndarray] | None] = [None] * len(ks)
    seen = [False] * len(ks)
    for start in range(len(ks)):
        if seen[start]:
            continue
        seen[start] = True
        stack = [start]
        while stack:
            u = stack.pop()
            order.append(u)
            for v, m in adj[u]:
                if not seen[v]:
                    seen[v] = True
                    parent[v] = (u, m.T)  # [v sigs, u sigs]
                    stack.append(v)
    return _Tree(tuple(ks), tuple(order), tuple(parent), 1)


def micro_edges(edges: list[Edge], latency: list[Edge], m: int) -> list[Edge]:
    """The whole batch's ``edges`` as a floor under m times their price on a micro-batch of 1/m of the batch:
    ``cost + (m - 1) x latency`` (``latency``: the same edges at the least latency rounds of their routes,
    ``problem.latency_edges``), and so their stage-to-stage moves (each message's latency).

    Why it is below: an edge is a few boxings, and a micro-batch's boxing takes some route r, whose time is
    its latency rounds lat(r) (paid whole, whatever the bytes) plus its bytes' time, at least 1/m of the
    same route's on the whole tensor (1/m of the bytes; a route that fits the smaller tensor fits the
    whole one, whose cheapest route costs ``cost`` at most as much). So m x (lat(r) + bytes(r) / m) =
    (lat(r) + bytes(r)) + (m - 1) lat(r) >= cost + (m - 1) x latency, as lat(r) >= latency for every route.
    Identical layers keep sharing one array (``StageFloor`` solves each distinct layer once)."""
    if m == 1:
        return edges
    made: dict[tuple[int, int], np.ndarray] = {}
    out = []
    for e, lat in zip(edges, latency, strict=True):
        if (e.src, e.dst, e.tensor) != (lat.src, lat.dst, lat.tensor):
            raise ValueError(f"micro_edges: edge lists out of order at {e.tensor} ({e.src} -> {e.dst})")
        out.append(Edge(e.src, e.dst, e.tensor, _plus(made, e.cost, lat.cost, m - 1),
                        None if e.cross_stage is None else _plus(made, e.cross_stage, lat.cross_stage, m - 1)))
    return out


def _plus(made: dict[tuple[int, int], np.ndarray], a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """``a + k b``, made once per pair of arrays (identical layers share theirs)."""
    key = (id(a), id(b))
    got = made.get(key)
    if got is None:
        got = made[key] = a + k * b
    return got
