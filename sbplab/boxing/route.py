"""Routes between n-D SBPs: shortest paths over SBP states, one mesh axis changing per step.

This is OneFlow's "middle node" search and DTensor's redistribute planner made exact: states are all
n-D SBPs the tensor can have on the mesh, edges are the valid one-axis steps of ``costs.py``, and
Dijkstra minimises estimated time, then bytes, then the number of steps. Routes depend only on the
tensor shape, the mesh shape, the dtype size and the hardware, so they are cached on exactly that.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from ..errors import SbplabError
from ..hardware import Hardware
from ..sbp import B, NdSbp, Partial, SbpParallel, Split, fmt_sbp
from .costs import edge_cost, state_ok
from .kinds import on_change

Key = tuple[int, int, int]  # (exact time in ticks of costs.time_scale, bytes sent by all ranks, steps)
Hop = tuple[int, SbpParallel]  # (mesh axis, its new SBP)
ZERO: Key = (0, 0, 0)


class BoxingError(SbplabError, ValueError):
    """No plan turns one layout into the other (or the request itself is malformed)."""


def add(a: Key, b: Key) -> Key:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def partial_ops(*states: NdSbp) -> tuple[str, ...]:
    """Reduce ops a search may use: sum (OneFlow's P) and whatever the endpoints use."""
    ops = {"sum"} | {x.op for s in states for x in s if isinstance(x, Partial)}
    return tuple(sorted(ops))


@lru_cache(maxsize=256)
def candidates(tensor_ndim: int, ops: tuple[str, ...]) -> tuple[SbpParallel, ...]:
    return tuple(Split(d) for d in range(tensor_ndim)) + (B,) + tuple(Partial(op) for op in ops)


@dataclass(frozen=True)
class Route:
    """A found route: the hops in order and its summed key."""

    hops: tuple[Hop, ...]
    key: Key


class StateGraph:
    """The layouts of one tensor on one mesh shape and the steps between them, built lazily.

    States are interned to ints and each state's outgoing (or incoming) steps are costed once, so a
    search touches hashes of SBP tuples only at its two ends and otherwise adds integer keys.
    """

    def __init__(self, shape: tuple[int, ...], mesh_shape: tuple[int, ...], itemsize: int, hardware: Hardware,
                 ops: tuple[str, ...]) -> None:
        self.shape, self.mesh_shape, self.itemsize, self.hardware = shape, mesh_shape, itemsize, hardware
        self.cands = candidates(len(shape), ops)
        self.states: list[NdSbp] = []
        self.ids: dict[NdSbp, int] = {}
        self._out: dict[int, list[tuple[int, Hop, Key]]] = {}
        self._in: dict[int, list[tuple[int, Hop, Key]]] = {}

    def id(self, state: NdSbp) -> int:
        i = self.ids.get(state)
        if i is None:
            i = self.ids[state] = len(self.states)
            self.states.append(state)
        return i

    def out(self, i: int) -> list[tuple[int, Hop, Key]]:
        """Steps leaving state ``i``: (next state, hop, key)."""
        got = self._out.get(i)
        if got is None:
            got = self._out[i] = self._expand(i, forward=True)
        return got

    def into(self, i: int) -> list[tuple[int, Hop, Key]]:
        """Steps entering state ``i``: (previous state, hop from it to ``i``, key)."""
        got = self._in.get(i)
        if got is None:
            got = self._in[i] = self._expand(i, forward=False)
        return got

    def _expand(self, i: int, forward: bool) -> list[tuple[int, Hop, Key]]:
        state, shape, mesh = self.states[i], self.shape, self.mesh_shape
        out = []
        for axis in range(len(mesh)):
            for x in self.cands:
                if x == state[axis]:
                    continue
                other = state[:axis] + (x,) + state[axis + 1:]
                if not state_ok(shape, mesh, other):
                    continue
                if forward:
                    c = edge_cost(shape, mesh, state, axis, x, self.itemsize, self.hardware)
                    hop = (axis, x)
                else:
                    c = edge_cost(shape, mesh, other, axis, state[axis], self.itemsize, self.hardware)
                    hop = (axis, state[axis])
                if c is not None:
                    out.append((self.id(other), hop, c.key))
        return out


@lru_cache(maxsize=256)
def state_graph(shape: tuple[int, ...], mesh_shape: tuple[int, ...], itemsize: int, hardware: Hardware,
                ops: tuple[str, ...]) -> StateGraph:
    return StateGraph(shape, mesh_shape, itemsize, hardware, ops)


def _dijkstra(g: StateGraph, start: int, target: int | None = None, backward: bool = False
              ) -> dict[int, tuple[Key, int, Hop | None]]:
    """Settled state ids -> (key, previous id on the path, hop). Stops once ``target`` is settled.

    Backward, it searches from ``start`` over entering steps: the "previous" id is then the next
    state towards ``start`` and the hop leads from the settled state to it.
    """
    best: dict[int, Key] = {start: ZERO}
    came: dict[int, tuple[int, Hop | None]] = {start: (-1, None)}
    done: dict[int, tuple[Key, int, Hop | None]] = {}
    heap = [(ZERO, start)]
    step = g.into if backward else g.out
    while heap:
        key, i = heapq.heappop(heap)
        if i in done:
            continue
        done[i] = (key, *came[i])
        if i == target:
            break
        for j, hop, c in step(i):
            if j in done:
                continue
            k = (key[0] + c[0], key[1] + c[1], key[2] + c[2])
            b = best.get(j)
            if b is None or k < b:
                best[j] = k
                came[j] = (i, hop)
                heapq.heappush(heap, (k, j))
    return done


def _unreachable(src: NdSbp, dst: NdSbp, shape, mesh_shape) -> BoxingError:
    return BoxingError(
        f"no boxing route from {fmt_sbp(src)} to {fmt_sbp(dst)} for shape {shape} on a {mesh_shape} mesh: "
        f"every intermediate layout would leave some rank an empty shard or break split nesting"
    )


def _walk(done: dict[int, tuple[Key, int, Hop | None]], i: int) -> list[Hop]:
    hops = []
    while done[i][1] != -1:
        hops.append(done[i][2])
        i = done[i][1]
    return hops


@lru_cache(maxsize=1 << 17)
def find_route(shape: tuple[int, ...], src: NdSbp, dst: NdSbp, mesh_shape: tuple[int, ...], itemsize: int,
               hardware: Hardware) -> Route:
    """The cheapest route from ``src`` to ``dst`` (both already validated)."""
    if src == dst:
        return Route((), ZERO)
    g = state_graph(shape, mesh_shape, itemsize, hardware, partial_ops(src, dst))
    s, t = g.id(src), g.id(dst)
    done = _dijkstra(g, s, t)
    if t not in done:
        raise _unreachable(src, dst, shape, mesh_shape)
    return Route(tuple(reversed(_walk(done, t))), done[t][0])


@lru_cache(maxsize=1024)
def routes_from(shape: tuple[int, ...], src: NdSbp, mesh_shape: tuple[int, ...], itemsize: int,
                hardware: Hardware, ops: tuple[str, ...]) -> dict[NdSbp, Route]:
    """Cheapest routes from ``src`` to every reachable state."""
    g = state_graph(shape, mesh_shape, itemsize, hardware, ops)
    done = _dijkstra(g, g.id(src))
    return {g.states[i]: Route(tuple(reversed(_walk(done, i))), k) for i, (k, _, _) in done.items()}


@lru_cache(maxsize=1024)
def routes_to(shape: tuple[int, ...], dst: NdSbp, mesh_shape: tuple[int, ...], itemsize: int,
              hardware: Hardware, ops: tuple[str, ...]) -> dict[NdSbp, Route]:
    """Cheapest routes from every state that can reach ``dst`` (hops in forward order)."""
    g = state_graph(shape, mesh_shape, itemsize, hardware, ops)
    done = _dijkstra(g, g.id(dst), backward=True)
    return {g.states[i]: Route(tuple(_walk(done, i)), k) for i, (k, _, _) in done.items()}


def apply_hops(state: NdSbp, hops: tuple[Hop, ...]) -> list[NdSbp]:
    """The states a route passes through, start included."""
    states = [state]
    for axis, new in hops:
        state = state[:axis] + (new,) + state[axis + 1:]
        states.append(state)
    return states


for _cache in (state_graph, find_route, routes_from, routes_to):
    on_change(_cache.cache_clear)  # routes depend on which kinds exist
