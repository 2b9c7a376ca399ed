"""Route search shortcuts change no route: steps costed only when relaxed, searches resumed from
where they stopped. Compared against the plain search (every step costed when its state is
expanded, every query searched from scratch, states interned as found) over many pairs of layouts
asked in one shuffled order, so even ties must break the same way."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

import sbplab as sl
from sbplab.boxing.costs import edge_cost, state_ok
from sbplab.boxing.route import ZERO, candidates, find_route, partial_ops, state_graph
from sbplab.boxing.state_graph import packed, unpacked
from sbplab.sbp import B, P, S

HW = sl.Hardware.cpu_box()


class _PlainGraph:
    """The layouts of one tensor on one mesh, interned in the order a search finds them, every step
    costed when its state is expanded (the search ``route.py`` did before its shortcuts)."""

    def __init__(self, shape, mesh_shape, ops) -> None:
        self.shape, self.mesh_shape, self.cands = shape, mesh_shape, candidates(len(shape), ops)
        self.states, self.ids, self.steps = [], {}, {}

    def id(self, state) -> int:
        if state not in self.ids:
            self.ids[state] = len(self.states)
            self.states.append(state)
        return self.ids[state]

    def out(self, i: int) -> list:
        if i not in self.steps:
            state, found = self.states[i], []
            for axis in range(len(self.mesh_shape)):
                for x in self.cands:
                    other = state[:axis] + (x,) + state[axis + 1:]
                    if x == state[axis] or not state_ok(self.shape, self.mesh_shape, other):
                        continue
                    c = edge_cost(self.shape, self.mesh_shape, state, axis, x, 4, HW)
                    if c is not None:
                        found.append((self.id(other), (axis, x), c.key))
            self.steps[i] = found
        return self.steps[i]


def _plain_route(g: _PlainGraph, src, dst):
    """A fresh Dijkstra over (key, state id): the hops and key of the route to ``dst``, or None."""
    start, target = g.id(src), g.id(dst)
    best, came, done, heap = {start: ZERO}, {start: None}, set(), [(ZERO, start)]
    while heap:
        key, i = heapq.heappop(heap)
        if i in done:
            continue
        done.add(i)
        if i == target:
            hops = []
            while came[i] is not None:
                i, hop = came[i]
                hops.append(hop)
            return tuple(reversed(hops)), key
        for j, hop, c in g.out(i):
            if j in done:
                continue
            k = (key[0] + c[0], key[1] + c[1], key[2] + c[2])
            if j not in best or k < best[j]:
                best[j], came[j] = k, (i, hop)
                heapq.heappush(heap, (k, j))
    return None


@pytest.mark.parametrize("shape,mesh_shape", [((64, 48), (2, 2, 2)), ((5, 7), (2, 3)), ((6, 4, 9), (2, 2))])
def test_routes_equal_the_plain_search(shape, mesh_shape):
    ents = [S(d) for d in range(len(shape))] + [B, P, P("max")]
    states = [s for s in itertools.product(ents, repeat=len(mesh_shape)) if state_ok(shape, mesh_shape, s)]
    pairs = [(a, b) for a in states for b in states if a != b]
    random.Random(0).shuffle(pairs)
    state_graph.cache_clear()
    find_route.cache_clear()
    plain: dict[tuple, _PlainGraph] = {}
    checked = 0
    for a, b in pairs[:1500]:
        ops = partial_ops(a, b)
        want = _plain_route(plain.setdefault(ops, _PlainGraph(shape, mesh_shape, ops)), a, b)
        if want is None:
            continue
        got = find_route(shape, a, b, mesh_shape, 4, HW)
        assert (got.hops, got.key) == want, (a, b)  # the same optimum, and ties broken the same way
        checked += 1
    assert checked > 300


@pytest.mark.parametrize("shape,mesh_shape", [((64, 48), (2, 2, 2)), ((5, 7), (2, 3))])
def test_listed_steps_are_exactly_the_costed_ones(shape, mesh_shape):
    """A step is listed (and its state interned) exactly where ``edge_cost`` prices one."""
    ops = ("max", "sum")
    g = state_graph(shape, mesh_shape, 4, HW, ops)
    cands = candidates(len(shape), ops)
    for state in itertools.product(cands, repeat=len(mesh_shape)):
        if not state_ok(shape, mesh_shape, state):
            continue
        i = g.id(state)
        listed = {tuple(e[1]) for e in g.out(i)}
        want = {(axis, x) for axis in range(len(mesh_shape)) for x in cands if x != state[axis]
                and state_ok(shape, mesh_shape, state[:axis] + (x,) + state[axis + 1:])
                and edge_cost(shape, mesh_shape, state, axis, x, 4, HW) is not None}
        assert listed == want, state
        for e in g.out(i):
            assert unpacked(g.key(e)) == edge_cost(shape, mesh_shape, state, *e[1], 4, HW).key


def test_packed_keys_order_and_add_as_tuples():
    """A search adds and compares packed keys: they must order and add exactly as the (ticks, bytes, steps)
    tuples do, and a key beyond the packed range is refused rather than wrapped."""
    rng = random.Random(0)
    keys = [(rng.choice([0, 1, 10**30]) * rng.randrange(1, 10**6), rng.randrange(0, 2**70), rng.randrange(0, 9))
            for _ in range(300)]
    for a, b in zip(keys, keys[1:]):
        assert (packed(a) < packed(b)) == (a < b)
        assert unpacked(packed(a) + packed(b)) == (a[0] + b[0], a[1] + b[1], a[2] + b[2])
    with pytest.raises(ValueError):
        packed((1, 2**96, 1))
