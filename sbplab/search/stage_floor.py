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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .pipeline import blocks_of
from .problem import Edge, OpSpace


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

    def value(self, zero: int, rounds: float) -> float:
        total = 0.0
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
