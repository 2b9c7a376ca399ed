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
from ..sbp import NdSbp, Partial, SbpParallel, fmt_sbp
from .kinds import on_change
from .state_graph import _TICKS_AT, Key, StateGraph, state_graph, unpacked
from .state_graph import candidates as candidates  # where callers have always found it
from .ticks import time_scale

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


@dataclass(frozen=True)
class Route:
    """A found route: the hops in order and its summed key."""

    hops: tuple[Hop, ...]
    key: Key


class _Search:
    """One Dijkstra search from one state, kept where it stopped (its last target settled, that
    target's steps not relaxed yet). A search started afresh would redo exactly the same pops and
    relaxations up to that point (the graph, its state ids and step keys never change once made),
    so going on from here gives the same answer for the next target, without redoing the prefix."""

    __slots__ = ("best", "came", "done", "heap", "pending")

    def __init__(self, start: int) -> None:
        self.best: dict[int, int] = {start: 0}  # packed keys
        self.came: dict[int, tuple[int, Hop | None]] = {start: (-1, None)}
        self.done: dict[int, tuple[int, int, Hop | None]] = {}
        self.heap: list[tuple[int, int]] = [(0, start)]
        self.pending: int | None = None  # settled, its steps not relaxed yet


def _dijkstra(g: StateGraph, start: int, target: int | None = None, backward: bool = False
              ) -> dict[int, tuple[int, int, Hop | None]]:
    """Settled state ids -> (packed key, previous id on the path, hop), up to ``target`` at least (all of
    them without one). The search is kept in ``g`` and goes on from there when asked again.

    Backward, it searches from ``start`` over entering steps: the "previous" id is then the next
    state towards ``start`` and the hop leads from the settled state to it.
    """
    s = g._searches.get((start, backward))
    if s is None:
        s = g._searches[(start, backward)] = _Search(start)
    done = s.done
    if target is not None and target in done:
        return done
    best, came, heap = s.best, s.came, s.heap
    step = g.into if backward else g.out
    i = s.pending
    s.pending = None
    while True:
        if i is None:
            if not heap:
                break
            key, i = heapq.heappop(heap)
            if i in done:
                i = None
                continue
            done[i] = (key, *came[i])
            if i == target:
                s.pending = i
                break
        key = done[i][0]
        for edge in step(i):
            j = edge[0]
            if j in done:
                continue
            c = edge[2]
            if c is None:
                c = g.key(edge)
            k = key + c
            b = best.get(j)
            if b is None or k < b:
                best[j] = k
                came[j] = (i, edge[1])
                heapq.heappush(heap, (k, j))
        i = None
    return done


def _unreachable(src: NdSbp, dst: NdSbp, shape, mesh_shape) -> BoxingError:
    strided = [x for x in (*src, *dst) if getattr(x, "chunks", 1) > 1]
    if strided:
        return BoxingError(
            f"no boxing route from {fmt_sbp(src)} to {fmt_sbp(dst)} for shape {shape} on a {mesh_shape} mesh: "
            f"a strided split ({strided[0]!r}) moves only to and from B and P on its own mesh axis, and must be the "
            f"only split of its dim on the way. Use S({strided[0].dim}) or B for this tensor")
    return BoxingError(
        f"no boxing route from {fmt_sbp(src)} to {fmt_sbp(dst)} for shape {shape} on a {mesh_shape} mesh: "
        f"every intermediate layout would leave some rank an empty shard or break split nesting"
    )


def _walk(done: dict[int, tuple[int, int, Hop | None]], i: int) -> list[Hop]:
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
    return Route(tuple(reversed(_walk(done, t))), unpacked(done[t][0]))


@lru_cache(maxsize=1024)
def routes_from(shape: tuple[int, ...], src: NdSbp, mesh_shape: tuple[int, ...], itemsize: int,
                hardware: Hardware, ops: tuple[str, ...]) -> dict[NdSbp, Route]:
    """Cheapest routes from ``src`` to every reachable state."""
    g = state_graph(shape, mesh_shape, itemsize, hardware, ops)
    done = _dijkstra(g, g.id(src))
    return {g.states[i]: Route(tuple(reversed(_walk(done, i))), unpacked(k)) for i, (k, _, _) in done.items()}


def seconds_from(g: StateGraph, src: NdSbp) -> dict[NdSbp, float]:
    """Seconds of the cheapest route from ``src`` to every state of ``g`` it reaches, without building
    the routes.

    Each route's step times (its ticks / ``time_scale``) are added in order from 0.0, as
    ``BoxingPlan.time_s`` adds its steps, so a value equals the plan's to the last bit. States settle
    after the state before them on their path, so one pass over the settled states in order does it."""
    done = _dijkstra(g, g.id(src))
    scale = time_scale(g.hardware)
    secs: dict[int, float] = {}
    for i, (key, prev, _) in done.items():
        secs[i] = 0.0 if prev == -1 else secs[prev] + ((key >> _TICKS_AT) - (done[prev][0] >> _TICKS_AT)) / scale
    return {g.states[i]: t for i, t in secs.items()}


@lru_cache(maxsize=1024)
def routes_to(shape: tuple[int, ...], dst: NdSbp, mesh_shape: tuple[int, ...], itemsize: int,
              hardware: Hardware, ops: tuple[str, ...]) -> dict[NdSbp, Route]:
    """Cheapest routes from every state that can reach ``dst`` (hops in forward order)."""
    g = state_graph(shape, mesh_shape, itemsize, hardware, ops)
    done = _dijkstra(g, g.id(dst), backward=True)
    return {g.states[i]: Route(tuple(_walk(done, i)), unpacked(k)) for i, (k, _, _) in done.items()}


def apply_hops(state: NdSbp, hops: tuple[Hop, ...]) -> list[NdSbp]:
    """The states a route passes through, start included."""
    states = [state]
    for axis, new in hops:
        state = state[:axis] + (new,) + state[axis + 1:]
        states.append(state)
    return states


for _cache in (find_route, routes_from, routes_to):
    on_change(_cache.cache_clear)  # routes depend on which kinds exist
