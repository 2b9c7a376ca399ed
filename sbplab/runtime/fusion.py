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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from .buffers import BufferSlot
from .specs import Actor, Compute, Ref, State

Wire = tuple[int, int]  # (part, output) of an earlier part, or (-1, index into the fused actor's inputs)


@dataclass
class Fused(Actor):
    """Compute actors ``parts`` fired as one; named after its last part, whose outputs it produces.

    wiring: per part, per kernel input, where the tensor comes from (``Wire``).
    """

    parts: tuple[Compute, ...] = ()
    wiring: tuple[tuple[Wire, ...], ...] = ()
    outputs: int = 1
    into: BufferSlot | None = None
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
    """(the actors with every fusable chain replaced by one ``Fused``, and per returned actor the plan
    indices it runs: its parts in order, or itself). A fused actor sits where its head was."""
    index = {a.name: i for i, a in enumerate(actors)}
    readers: dict[str, set[int]] = {}
    for i, a in enumerate(actors):
        refs = list(a.inputs)
        if isinstance(a, State) and a.update is not None:
            refs.append(a.update)
        for r in refs:
            readers.setdefault(r.actor, set()).add(i)
    guards = {a.into.pool for a in actors if getattr(a, "into", None) is not None}
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
    if not next_of:
        return list(actors), [[i] for i in range(len(actors))]
    anc = _ancestors(actors, index)
    heads = sorted(set(next_of) - set(next_of.values()))
    chain_of: dict[int, list[int]] = {}
    while heads:
        h = heads.pop()
        chain = [h]
        while chain[-1] in next_of:
            j = next_of[chain[-1]]
            outside = {index[r.actor] for r in actors[j].inputs} - set(chain)
            if any(not (anc[h] >> p) & 1 for p in outside):
                heads.append(j)  # j reads something the head did not wait for: a chain of its own
                break
            chain.append(j)
        if len(chain) > 1:
            for i in chain:
                chain_of[i] = chain
    out: list[Actor] = []
    origin: list[list[int]] = []
    for i, a in enumerate(actors):
        chain = chain_of.get(i)
        if chain is None:
            out.append(a)
            origin.append([i])
        elif chain[0] == i:
            out.append(_fuse([actors[k] for k in chain]))  # type: ignore[misc]
            origin.append(chain)
    return out, origin


def _fuse(parts: list[Compute]) -> Fused:
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
    last = parts[-1]
    return Fused(last.name, tuple(inputs), last.registers, last.phase, last.scope, tuple(parts), tuple(wiring),
                 last.outputs, last.into)
