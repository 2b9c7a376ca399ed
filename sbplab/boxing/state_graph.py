"""The graph a route search walks: the layouts (n-D SBPs) of one tensor on one mesh shape, and the
valid one-axis steps between them with their exact search keys, built lazily as a search asks.

A layout is a tuple of SBP objects, and hashing or comparing those runs Python code for every entry.
Inside the graph a layout is therefore also coded as a tuple of small ints (an index per entry into
the graph's list of SBPs), and every question a search asks of a step is answered from int-keyed
tables: does a kind turn this entry into that one, do the later mesh axes let it nest, does the
layout leave every rank a non-empty piece. Each question is put to the rules in ``costs.py`` once
per graph and remembered; the answers (and the steps listed, in their order) are the rules' own.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..hardware import Hardware
from ..sbp import B, NdSbp, Partial, SbpParallel, Split
from .costs import state_ok, step_key, step_kinds, step_problem
from .kinds import on_change

Key = tuple[int, int, int]  # (exact time in ticks of ticks.time_scale, bytes sent by all ranks, steps)
Code = tuple[int, ...]  # a layout as indices into StateGraph's entries


@lru_cache(maxsize=1024)
def _has_kind(old: SbpParallel, new: SbpParallel) -> bool:
    """Whether some one-axis kind turns ``old`` into ``new`` (``kinds_between``, asked per edge)."""
    return bool(step_kinds(old, new))


@lru_cache(maxsize=256)
def candidates(tensor_ndim: int, ops: tuple[str, ...]) -> tuple[SbpParallel, ...]:
    return tuple(Split(d) for d in range(tensor_ndim)) + (B,) + tuple(Partial(op) for op in ops)


class StateGraph:
    """The layouts of one tensor on one mesh shape and the steps between them, built lazily.

    States are interned to ints and each state's outgoing (or incoming) steps are listed once, so a
    search touches hashes of SBP tuples only at its two ends and otherwise adds integer keys. A step
    is costed the first time a search relaxes it: a search never needs the cost of a step into a
    state it has already settled, and about 40% of the steps of a large model's graphs are never
    relaxed at all.
    """

    def __init__(self, shape: tuple[int, ...], mesh_shape: tuple[int, ...], itemsize: int, hardware: Hardware,
                 ops: tuple[str, ...]) -> None:
        self.shape, self.mesh_shape, self.itemsize, self.hardware = shape, mesh_shape, itemsize, hardware
        self.cands = candidates(len(shape), ops)
        self.states: list[NdSbp] = []
        self.ids: dict[NdSbp, int] = {}
        self._out: dict[int, list[list]] = {}
        self._in: dict[int, list[list]] = {}
        self._searches: dict[tuple[int, bool], Any] = {}  # (start, backward) -> its route._Search so far
        # the int coding: entries (the candidates, then any other SBP a caller's layout holds)
        self._entries: list[SbpParallel] = list(self.cands)
        self._entry: dict[SbpParallel, int] = {x: n for n, x in enumerate(self.cands)}
        self._codes: list[Code] = []  # per state id
        self._code_id: dict[Code, int] = {}
        self._ok: dict[Code, bool] = {}  # state_ok
        self._turns: dict[tuple[int, bool], list[int]] = {}  # (entry, forward) -> candidates a kind turns it into
        self._nests: dict[tuple[int, int, Code], bool] = {}  # (old, new, later axes) -> step_problem is None

    def id(self, state: NdSbp) -> int:
        i = self.ids.get(state)
        if i is None:
            entry, entries = self._entry, self._entries
            code = []
            for x in state:
                c = entry.get(x)
                if c is None:
                    c = entry[x] = len(entries)
                    entries.append(x)
                code.append(c)
            i = self._add(tuple(state), tuple(code))
        return i

    def _add(self, state: NdSbp, code: Code) -> int:
        i = self.ids[state] = self._code_id[code] = len(self.states)
        self.states.append(state)
        self._codes.append(code)
        return i

    def out(self, i: int) -> list[list]:
        """Steps leaving state ``i``: [next state, hop, key or None until ``key`` costs it, ...]."""
        got = self._out.get(i)
        if got is None:
            got = self._out[i] = self._expand(i, forward=True)
        return got

    def into(self, i: int) -> list[list]:
        """Steps entering state ``i``: [previous state, hop from it to ``i``, key or None, ...]."""
        got = self._in.get(i)
        if got is None:
            got = self._in[i] = self._expand(i, forward=False)
        return got

    def _expand(self, i: int, forward: bool) -> list[list]:
        """Every layout one axis away that is valid (``state_ok``) and reached by a valid step, in the
        order of mesh axes, then candidates: exactly the steps ``edge_cost`` prices."""
        state, code = self.states[i], self._codes[i]
        entries, code_id, ok, nests = self._entries, self._code_id, self._ok, self._nests
        out = []
        for axis, oi in enumerate(code):
            head, tail = code[:axis], code[axis + 1:]
            for xi in self._turns_from(oi, forward):
                fi, ni = (oi, xi) if forward else (xi, oi)  # the step's entry before and after, on ``axis``
                other = head + (xi,) + tail
                good = ok.get(other)
                if good is None:
                    good = ok[other] = state_ok(self.shape, self.mesh_shape, tuple(entries[c] for c in other))
                if not good:
                    continue
                n = nests.get((fi, ni, tail))
                if n is None:
                    frm = state if forward else state[:axis] + (entries[xi],) + state[axis + 1:]
                    n = nests[(fi, ni, tail)] = step_problem(frm, axis, entries[ni]) is None
                if not n:
                    continue
                j = code_id.get(other)
                if j is None:
                    j = self._add(tuple(entries[c] for c in other), other)
                out.append([j, (axis, entries[ni]), None, state if forward else self.states[j]])
        return out

    def _turns_from(self, oi: int, forward: bool) -> list[int]:
        """The candidates (indices) some kind turns entry ``oi`` into (backward: that turn into it)."""
        got = self._turns.get((oi, forward))
        if got is None:
            e = self._entries
            got = self._turns[(oi, forward)] = [
                xi for xi in range(len(self.cands))
                if xi != oi and _has_kind(*((e[oi], e[xi]) if forward else (e[xi], e[oi])))]
        return got

    def key(self, edge: list) -> Key:
        """The step's search key (``edge_cost(...).key``), costed once and kept in the edge."""
        k = edge[2]
        if k is None:
            axis, new = edge[1]
            k = edge[2] = step_key(self.shape, self.mesh_shape, edge[3], axis, new, self.itemsize, self.hardware)
        return k


@lru_cache(maxsize=256)
def state_graph(shape: tuple[int, ...], mesh_shape: tuple[int, ...], itemsize: int, hardware: Hardware,
                ops: tuple[str, ...]) -> StateGraph:
    return StateGraph(shape, mesh_shape, itemsize, hardware, ops)


for _cache in (_has_kind, state_graph):
    on_change(_cache.cache_clear)  # steps depend on which kinds exist
