"""The communication order of a plan whose ranks all run the same actors, derived from one rank.

``schedule.derive_comm_order`` simulates every rank tick by tick. Under data, tensor and ZeRO
parallelism every rank runs the same actors in the same positions (only names and groups differ),
and every communication is a collective its members hold at one position. Then all ranks move in
lockstep: by induction over ticks, every rank has the same counters, so each fires the same compute
and becomes ready for the same collectives in the same tick; a collective completes in the tick its
members post it, since all of them post together. Simulating one rank is therefore enough, and the
order the full simulation would write is rebuilt from it exactly: in each tick the collectives that
started are taken in the full simulation's order (priority, then match key, which for one position
means the collective's name), each listing its members in rank order.

``uniform_rank`` checks the conditions on everything the firing rule and the simulation read (actor
types, scopes, registers, priorities, wiring by position, group sizes, that each collective sits at
one position on all its members); any difference, any send or receive, returns None, and the full
simulation runs. A deadlock is left to the full simulation too, which reports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .firing import FiringGraph, ReadyQueue
from .specs import Collective, State

if TYPE_CHECKING:
    from .actor_plan import ActorPlan, CommSlot


def _rows(actors: list) -> tuple[list[tuple], dict[str, int]] | None:
    """What the firing rule and the simulation read of each actor, wiring by position; None if a
    communication is not a collective."""
    pos = {a.name: i for i, a in enumerate(actors)}
    rows = []
    for a in actors:
        coll = isinstance(a, Collective)
        if a.lane == "comm" and not coll:
            return None
        upd = a.update if isinstance(a, State) else None
        # a collective's ``order`` only sorts the starts within a tick (the order written), never
        # what fires when: it is left out here and used when the order is rebuilt
        rows.append((type(a), a.scope, a.out_scope, a.num_outputs, a.registers, 0 if coll else getattr(a, "order", 0),
                     tuple([(pos[x.actor], x.index) for x in a.inputs]),
                     None if upd is None else (pos[upd.actor], upd.index), len(a.group) if coll else 0))
    return rows, pos


def uniform_rank(plan: ActorPlan) -> int | None:
    """The lowest rank with actors when every rank with actors runs the same actors position by
    position and every communication is a collective held at one position by exactly its group."""
    busy = [r for r, rp in plan.ranks.items() if rp.n_actors]
    if not busy:
        return None
    # a rank the lowering made alike to another (``plan.alike``) has its rows: one rank per group is read
    rep_of = {m: rep for rep, ms in (plan.alike or {}).items() for m in ms}
    first = None
    for r in busy:
        if rep_of.get(r, r) != r:
            continue
        got = _rows(plan.ranks[r].actors)
        if got is None:
            return None
        rows = got[0]
        if first is None:
            first = rows
        elif rows != first:
            return None
    comm_pos: dict[int, dict[str, int]] = {}  # rank -> its collectives' positions by name
    for r in busy:
        comm_pos[r] = {a.name: i for i, a in plan.ranks[r].comm_items()}
    holders: dict[str, int] = {}
    placed: set[tuple] = set()  # (name, group, position) whose members were all found there
    for r in busy:
        for i, a in plan.ranks[r].comm_items():
            if not isinstance(a, Collective):
                return None
            holders[a.name] = holders.get(a.name, 0) + 1
            key = (a.name, a.group, i)
            if key in placed:
                continue
            for m in a.group:
                if m not in comm_pos or comm_pos[m].get(a.name) != i:
                    return None
            placed.add(key)
    for r in busy:
        for _, a in plan.ranks[r].comm_items():
            if holders[a.name] != len(a.group):  # type: ignore[attr-defined]
                return None
    return busy[0]


def derive_from_one(plan: ActorPlan, rep: int, steps: int = 1) -> tuple[CommSlot, ...] | None:
    """``derive_comm_order`` of a plan ``uniform_rank`` accepted, simulating rank ``rep`` alone;
    None if the simulation gets stuck."""
    g = FiringGraph(plan.ranks[rep].actors, plan.micro_batches, steps, plan.ranks[rep].schedule)
    try:
        return _simulate_one(plan, g)
    finally:
        g.unlink()


def _simulate_one(plan: ActorPlan, g: FiringGraph) -> tuple[CommSlot, ...] | None:
    from .actor_plan import CommSlot

    micro = plan.micro_batches
    nodes, can_fire = g.nodes, g.can_fire
    acts = [n.actor for n in nodes]
    comm = [a.lane == "comm" for a in acts]
    per_micro = [a.scope == "micro" for a in acts]
    busy = [rp for rp in plan.ranks.values() if rp.n_actors]
    # per position of a collective: (order, name, members in rank order) of every rank's collective there
    held: dict[int, list[tuple[int, str, tuple[int, ...]]]] = {}
    for i, c in enumerate(comm):
        if c:
            held[i] = sorted({(a.order, a.name, tuple(sorted(a.group))) for rp in busy  # type: ignore[attr-defined]
                              for a in (rp.actor_at(i),)})
    order: list[CommSlot] = []
    dirty = set(range(len(nodes)))
    ready = ReadyQueue(g)  # the compute lane's choice
    while g.unfinished:
        posts = []
        for i in sorted(dirty):
            n = nodes[i]
            k = n.started
            if k >= n.total:
                continue
            if not comm[i]:
                ready.offer(i)
                continue
            if can_fire(i):  # every member posts it now too, so it completes now
                posts.append((i, k))
        dirty.clear()
        events = []
        written = []  # ((priority, match key), members) of the collectives started now, as the full run sorts them
        for i, k in posts:
            g.start(i)
            dirty.add(i)
            m = k % micro if per_micro[i] else -1
            if (k // micro == 0) if per_micro[i] else (k == 0):
                written.extend(((((0, m, o, i), ("coll", name, m)), name, members) for o, name, members in held[i]))
            events.append((i, k))
        for (_, (_, name, m)), _, members in sorted(written):
            order.extend([CommSlot(r, name, m) for r in members])
        if ready:
            i = ready.take()
            events.append((i, g.start(i)))
            dirty.add(i)
        if not events:
            return None
        for i, k in events:
            dirty.update(g.finish(i, k))
    return tuple(order)
