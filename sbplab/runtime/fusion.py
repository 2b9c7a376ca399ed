"""Fused compute chains: a run of local compute actors of one rank, fired as one actor.

Every firing costs the executor bookkeeping besides its kernel: reading its registers, the firing
rule's counters, acks, the ready queue; a few microseconds on a CPU. A small model's step is dozens
of firings of tiny kernels, so that bookkeeping is a visible share of it. A chain ``a -> b`` where
``b`` is the only reader of ``a``'s outputs needs none of it between the two: the executor fires the
chain as one actor whose behaviour runs the kernels back to back and hands ``a``'s outputs straight
to ``b`` (no register, no ack). Longer chains grow the same way.

The plan does not change. The compiler, the simulator and every picture see the actors the plan
has, and the trace still gets one event per part, under the part's own name: the executor fuses
when it loads a rank's actors (``fuse_chains``), and maps each part back to its plan index.

When is it safe? The fused actor fires only when every part can, so it must never wait for an input
the head would not have waited for: that would hold the head's inputs longer than the plan does,
and the proof that the communication order cannot deadlock (``schedule.py``) is about the plan.
So every input a later part reads from outside the chain must come from an ancestor of the head
(along data edges, not a State's lagged update): the counters only grow, so what the head's firing
needed was produced, and what the part reads of the same producer is no later.

Optimizer gangs. A gradient bucket's unpack has one reader per gradient, the parameter's update, so
it heads no chain, and a data-parallel step would spend a firing per parameter on updates of a few
microseconds each. A step actor ``h`` whose every reader is such an update fuses with all of them
into one actor named ``h`` whose outputs are the updates' outputs, in turn (``Fused.exposed``); the
States they update read those instead. It can fire exactly when ``h`` could:

- every update reads only ``h`` and ancestors of ``h`` (as in a chain);
- the update outputs are read only by States, as their next value, and every such State is an
  ancestor of ``h``. When ``h``'s step-k firing can start, each State has fired for step k, and
  that firing absorbed step k - 1's update: the gang's outputs before k are released, so a
  register is free whatever the counts;
- if ``h`` guards a shared buffer (the bucket's), each of those States is also an ancestor of every
  actor writing into it, so the writer's next firing finds the buffer released, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from .buffers import BufferSlot
from .specs import Actor, Compute, Ref, State

Wire = tuple[int, int]  # (part, output) of an earlier part, or (-1, index into the fused actor's inputs)


@dataclass
class Fused(Actor):
    """Compute actors ``parts`` fired as one: a chain is named after its last part, whose outputs it
    produces; a gang after its head, and its outputs are ``exposed``.

    wiring: per part, per kernel input, where the tensor comes from (``Wire``).
    exposed: the (part, output) pairs the fused actor outputs, in order; empty: the last part's.
    """

    parts: tuple[Compute, ...] = ()
    wiring: tuple[tuple[Wire, ...], ...] = ()
    outputs: int = 1
    into: BufferSlot | None = None
    exposed: tuple[Wire, ...] = ()
    kind: ClassVar[str] = "compute"

    @property
    def num_outputs(self) -> int:
        return self.outputs

    @property
    def op(self) -> str:
        """The last part's op: what the fused actor's outputs are."""
        return self.parts[-1].op

    @property
    def label(self) -> str:
        return "+".join(p.op for p in self.parts)


def _plain(a: Actor) -> bool:
    return type(a) is Compute


def _ancestors(actors: Sequence[Actor], index: dict[str, int]) -> list[int]:
    """Per actor, a bit set of every actor it depends on through data edges (not lagged updates)."""
    anc: list[int | None] = [None] * len(actors)
    for start in range(len(actors)):
        stack = [start]
        while stack:  # iterative depth-first: a deep model's chain of actors exceeds Python's recursion
            i = stack[-1]
            if anc[i] is not None:
                stack.pop()
                continue
            todo = [index[r.actor] for r in actors[i].inputs if anc[index[r.actor]] is None]
            if todo:
                stack.extend(todo)
                continue
            bits = 0
            for r in actors[i].inputs:
                p = index[r.actor]
                bits |= anc[p] | (1 << p)  # type: ignore[operator]
            anc[i] = bits
            stack.pop()
    return anc  # type: ignore[return-value]


def fuse_chains(actors: Sequence[Actor]) -> tuple[list[Actor], list[list[int]]]:
    """(the actors with every fusable chain and gang replaced by one ``Fused``, and per returned actor the
    plan indices it runs: its parts in order, or itself). A fused actor sits where its head was."""
    index = {a.name: i for i, a in enumerate(actors)}
    readers: dict[str, set[int]] = {}
    for i, a in enumerate(actors):
        refs = list(a.inputs)
        if isinstance(a, State) and a.update is not None:
            refs.append(a.update)
        for r in refs:
            readers.setdefault(r.actor, set()).add(i)
    guards = {a.into.pool for a in actors if getattr(a, "into", None) is not None}
    heads = [i for i, a in enumerate(actors) if _plain(a) and a.into is None and a.scope == "step"  # type: ignore[attr-defined]
             and a.outputs > 1 and len(readers.get(a.name, ())) > 1]  # type: ignore[attr-defined]
    next_of: dict[int, int] = {}
    for i, a in enumerate(actors):
        if not _plain(a) or a.into is not None or a.name in guards or a.outputs == 0:  # type: ignore[attr-defined]
            continue
        rd = readers.get(a.name, set())
        if len(rd) == 1:
            j = next(iter(rd))
            b = actors[j]
            if _plain(b) and b.scope == a.scope:
                next_of[i] = j
    if not next_of and not heads:
        return list(actors), [[i] for i in range(len(actors))]
    anc = _ancestors(actors, index)
    gang_of = _gangs(actors, heads, index, readers, anc)
    chain_of: dict[int, list[int]] = dict(gang_of)
    starts = sorted(set(next_of) - set(next_of.values()))
    while starts:
        h = starts.pop()
        chain = [h]
        while chain[-1] in next_of:
            j = next_of[chain[-1]]
            outside = {index[r.actor] for r in actors[j].inputs} - set(chain)
            if any(not (anc[h] >> p) & 1 for p in outside):
                starts.append(j)  # j reads something the head did not wait for: a chain of its own
                break
            chain.append(j)
        if len(chain) > 1 and not any(i in gang_of for i in chain):
            for i in chain:
                chain_of[i] = chain
    renamed: dict[Ref, Ref] = {}  # an update's output -> the gang output that now carries it
    fused: dict[int, Fused] = {}
    for h, gang in gang_of.items():
        if gang[0] == h:
            fused[h] = _fuse([actors[k] for k in gang], gang=True)  # type: ignore[misc]
            for n, (part, j) in enumerate(fused[h].exposed):
                renamed[Ref(actors[gang[part]].name, j)] = Ref(actors[h].name, n)
    out: list[Actor] = []
    origin: list[list[int]] = []
    for i, a in enumerate(actors):
        chain = chain_of.get(i)
        if chain is None:
            if isinstance(a, State) and a.update in renamed:
                a = replace(a, update=renamed[a.update])
            out.append(a)
            origin.append([i])
        elif chain[0] == i:
            out.append(fused.get(i) or _fuse([actors[k] for k in chain]))  # type: ignore[misc]
            origin.append(chain)
    return out, origin


def _gangs(actors: Sequence[Actor], heads: list[int], index: dict[str, int], readers: dict[str, set[int]],
           anc: list[int]) -> dict[int, list[int]]:
    """Per member of each optimizer gang (module doc), the gang: its head, then its updates."""
    writers: dict[str, list[int]] = {}
    for i, a in enumerate(actors):
        into = getattr(a, "into", None)
        if into is not None:
            writers.setdefault(into.pool, []).append(i)
    out: dict[int, list[int]] = {}
    for h in heads:
        name = actors[h].name
        parts = sorted(readers[name])
        if all(_update_of(actors, j, h, index, readers, anc, writers.get(name, [])) for j in parts):
            gang = [h, *parts]
            for i in gang:
                out[i] = gang
    return out


def _update_of(actors: Sequence[Actor], j: int, h: int, index: dict[str, int], readers: dict[str, set[int]],
               anc: list[int], writers: list[int]) -> bool:
    """Whether actor j may join the gang headed by h (the three conditions of the module doc)."""
    b = actors[j]
    if not _plain(b) or b.scope != "step" or b.into is not None or b.outputs == 0:  # type: ignore[attr-defined]
        return False
    if any(index[r.actor] != h and not (anc[h] >> index[r.actor]) & 1 for r in b.inputs):
        return False
    for c in readers.get(b.name, ()):
        s = actors[c]
        if not isinstance(s, State) or not (anc[h] >> c) & 1 or any(not (anc[w] >> c) & 1 for w in writers):
            return False
    return bool(readers.get(b.name))


def _fuse(parts: list[Compute], gang: bool = False) -> Fused:
    pos = {p.name: n for n, p in enumerate(parts)}
    inputs: list[Ref] = []
    wiring: list[tuple[Wire, ...]] = []
    for p in parts:
        wires = []
        for r in p.inputs:
            if r.actor in pos:
                wires.append((pos[r.actor], r.index))
            else:  # every outside read stays one read: its producer counts the acks per read
                wires.append((-1, len(inputs)))
                inputs.append(r)
        wiring.append(tuple(wires))
    if gang:
        head = parts[0]
        exposed = tuple((n, j) for n in range(1, len(parts)) for j in range(parts[n].outputs))
        return Fused(head.name, tuple(inputs), head.registers, head.phase, head.scope, tuple(parts), tuple(wiring),
                     len(exposed), None, exposed)
    last = parts[-1]
    return Fused(last.name, tuple(inputs), last.registers, last.phase, last.scope, tuple(parts), tuple(wiring),
                 last.outputs, last.into)
