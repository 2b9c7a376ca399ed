"""The graph a route search walks: the layouts (n-D SBPs) of one tensor on one mesh shape, and the
valid one-axis steps between them with their exact search keys, built lazily as a search asks.

A layout is a tuple of SBP objects, and hashing or comparing those runs Python code for every entry.
Inside the graph a layout is therefore also coded as a tuple of small ints (an index per entry into
the graph's list of SBPs), and every question a search asks of a step is answered on codes: does a
kind turn this entry into that one (asked of the kinds once per pair of entries and remembered),
does the layout leave every rank a non-empty piece and do the later mesh axes let the step nest
(``coded_rules``, the same rules as ``costs.py``'s). The steps listed, in their order, and the state
numbers are exactly those of a search over SBP tuples.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..hardware import Hardware
from ..sbp import B, NdSbp, Partial, SbpParallel, Split
from .coded_rules import Code, EntryFacts, code_ok, nest_blockers
from .costs import cheapest, piece_splits, step_kinds, step_rates
from .kinds import on_change

Key = tuple[int, int, int]  # (exact time in ticks of ticks.time_scale, bytes sent by all ranks, steps)

# A search adds and compares keys millions of times, so inside it a key (ticks, bytes, steps) is one int,
# ticks << 128 | bytes << 32 | steps: every field is a whole number >= 0, and while bytes < 2**96 and steps
# < 2**32 (a route's bytes by all ranks, its steps: far below) ints add field by field without a carry and
# order as the tuples do, so the pops, ties and paths are exactly those of a search on tuples.
_BYTES_AT, _TICKS_AT = 32, 128


def packed(k: Key) -> int:
    """``k`` as one int (see above); ``unpacked`` gives it back. Whole floats (a shape given in floats) are
    taken at their value; a fraction or a field out of range is refused rather than rounded or carried."""
    t, b, n = (int(x) for x in k)
    if (t, b, n) != tuple(k) or not (0 <= b < 1 << (_TICKS_AT - _BYTES_AT) and 0 <= n < 1 << _BYTES_AT and t >= 0):
        raise ValueError(f"a step key that does not pack into one int: {k}")
    return t << _TICKS_AT | b << _BYTES_AT | n


def unpacked(k: int) -> Key:
    return (k >> _TICKS_AT, (k >> _BYTES_AT) & ((1 << (_TICKS_AT - _BYTES_AT)) - 1), k & ((1 << _BYTES_AT) - 1))


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
        self._turns: dict[tuple[int, bool], list] = {}  # (entry, forward) -> its ``_moves``
        self._how: dict[tuple[int, int, int], tuple] = {}  # (old, new, axis) -> (kinds, their tick rates)
        self._keys = _step_keys(shape, mesh_shape, itemsize, hardware)
        self._facts = EntryFacts()
        for x in self.cands:
            self._facts.add(x)

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
                    self._facts.add(x)
                    self._turns.clear()  # a new partial entry may block steps that nested before
                    # a new strided split is a new step out of B and P: the steps and searches listed
                    # so far lack it
                    self._out.clear()
                    self._in.clear()
                    self._searches.clear()
                code.append(c)
            i = self._add(tuple(state), tuple(code))
        return i

    def _add(self, state: NdSbp, code: Code) -> int:
        i = self.ids[state] = self._code_id[code] = len(self.states)
        self.states.append(state)
        self._codes.append(code)
        return i

    def out(self, i: int) -> list[list]:
        """Steps leaving state ``i``: [next state, hop, key or None until ``key`` costs it, the code of
        the state the step leaves, its entry before and after on the hop's axis (codes)]."""
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
        code = self._codes[i]
        entries, code_id, ok, facts = self._entries, self._code_id, self._ok, self._facts
        shape, mesh = self.shape, self.mesh_shape
        out = []
        for axis, oi in enumerate(code):
            head, tail = code[:axis], code[axis + 1:]
            for xi, fi, ni, blockers in self._moves(oi, forward):
                other = head + (xi,) + tail
                good = ok.get(other)
                if good is None:
                    good = ok[other] = code_ok(other, shape, mesh, facts)
                if not good or not blockers.isdisjoint(tail):  # invalid, or the step does not nest
                    continue
                j = code_id.get(other)
                if j is None:
                    j = self._add(tuple([entries[c] for c in other]), other)
                out.append([j, (axis, entries[ni]), None, code if forward else other, fi, ni])
        return out

    def _moves(self, oi: int, forward: bool) -> list[tuple[int, int, int, frozenset[int]]]:
        """The candidates some kind turns entry ``oi`` into (backward: that turn into it), each as
        (candidate, the step's entry before, after, its ``nest_blockers``)."""
        got = self._turns.get((oi, forward))
        if got is None:
            e, got = self._entries, []
            for xi in range(len(e)):  # the candidates, and a caller's strided splits (reached only from B or P)
                fi, ni = (oi, xi) if forward else (xi, oi)
                if xi != oi and _has_kind(e[fi], e[ni]):
                    got.append((xi, fi, ni, nest_blockers(fi, ni, self._facts)))
            self._turns[(oi, forward)] = got
        return got

    def key(self, edge: list) -> int:
        """The step's search key (``edge_cost(...).key``, packed into one int: ``route.packed``), costed once
        and kept in the edge; shared with the graphs of the same tensor that differ in their reduce ops
        (``_step_keys``)."""
        k = edge[2]
        if k is None:
            axis, new = edge[1]
            old = self._entries[edge[4]]
            splits = piece_splits(tuple(self._entries[c] for c in edge[3]), axis)  # strided splits with their k
            shared = (splits, axis, old, new)
            k = self._keys.get(shared)
            if k is None:
                how = self._how.get((edge[4], edge[5], axis))
                if how is None:
                    kinds = step_kinds(old, new)
                    how = self._how[(edge[4], edge[5], axis)] = (
                        kinds, step_rates(kinds, self.hardware, axis, self.mesh_shape[axis]))
                k = self._keys[shared] = packed(cheapest(self.shape, self.mesh_shape, splits, axis, old, new,
                                                         self.itemsize, *how)[0])
            edge[2] = k
        return k


@lru_cache(maxsize=256)
def _step_keys(shape: tuple[int, ...], mesh_shape: tuple[int, ...], itemsize: int,
               hardware: Hardware) -> dict[tuple, int]:
    """Step keys by (piece splits, axis, old entry, new entry): what ``cheapest`` depends on besides the
    tensor and the mesh. The graphs of one tensor with different reduce ops share most of their steps."""
    return {}


@lru_cache(maxsize=256)
def state_graph(shape: tuple[int, ...], mesh_shape: tuple[int, ...], itemsize: int, hardware: Hardware,
                ops: tuple[str, ...]) -> StateGraph:
    return StateGraph(shape, mesh_shape, itemsize, hardware, ops)


for _cache in (_has_kind, _step_keys, state_graph):
    on_change(_cache.cache_clear)  # steps depend on which kinds exist
