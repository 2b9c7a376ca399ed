"""The communication order of a plan derived by simulating one rank per class of ranks that move in lockstep.

``schedule.derive_all`` simulates every rank tick by tick: 64 ranks of a pipeline x data layout are 64
firing graphs, though its ranks are a few kinds (one per stage). Two ranks are in one *class* when the
firing rule and the simulation read the same of their actors position by position (types, scopes,
registers, compute priorities, wiring, a pipeline schedule's actions and the stage of each actor) and,
refined as in colour refinement, every communication of theirs meets parties of the same classes at
the same positions. Then, by induction over ticks, all members of a class have the same counters: each
fires the same compute and posts the same communication in the same tick, and a communication completes
in the tick its last class posts it. So one firing graph per class is simulated, and the order the full
simulation writes is rebuilt from it exactly: per tick, each communication that completed (one per
match key, its members named from their own actors) is sorted as the full simulation sorts them, by the
priority its last poster had (the highest rank among those that posted in that tick) and its match key,
and lists its members in rank order.

Any difference keeps ranks in different classes, so this changes the work, never the order (tested
against ``derive_all``). A plan that gets stuck returns None: the full simulation reports the deadlock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .firing import FiringGraph, ReadyQueue
from .specs import Collective, Send, State

if TYPE_CHECKING:
    from .actor_plan import ActorPlan, CommSlot


def _rows(actors: list, stage_of: dict | None) -> tuple:
    """What the firing rule and the simulation read of each actor, wiring by position (a communication's
    ``order`` only sorts what completes in one tick: read from each rank's own actor when the order is
    written)."""
    pos = {a.name: i for i, a in enumerate(actors)}
    rows = []
    for a in actors:
        comm = a.lane == "comm"
        upd = a.update if isinstance(a, State) else None
        rows.append((type(a), a.scope, a.out_scope, a.num_outputs, a.registers, 0 if comm else getattr(a, "order", 0),
                     tuple([(pos[x.actor], x.index) for x in a.inputs]),
                     None if upd is None else (pos[upd.actor], upd.index),
                     len(a.group) if isinstance(a, Collective) else 0,
                     None if stage_of is None else stage_of.get(a.name),
                     None if getattr(a, "into", None) is None else pos[a.into.pool]))  # type: ignore[attr-defined]
    return tuple(rows)


def _initial(plan: ActorPlan, busy: list[int]) -> dict[int, int]:
    """Rank -> a number for its rows and schedule; a rank the lowering made alike to another (``plan.alike``)
    shares that rank's rows, so one rank per group is read."""
    rep_of = {m: rep for rep, ms in (plan.alike or {}).items() for m in ms}
    number: dict[tuple, int] = {}
    rows_of: dict[int, tuple] = {}
    out = {}
    for r in busy:
        rp = plan.ranks[r]
        sched = rp.schedule
        rep = rep_of.get(r, r)
        rows = rows_of.get(rep)
        if rows is None:
            rows = rows_of[rep] = _rows(plan.ranks[rep].actors, plan.ranks[rep].schedule.stage_of
                                        if plan.ranks[rep].schedule is not None else None)
        key = (rows, None if sched is None else (sched.name, sched.actions))
        out[r] = number.setdefault(key, len(number))
    return out


class _Comms:
    """Every rank's communication by position: its actor, and the (rank, position) of each party."""

    def __init__(self, plan: ActorPlan, busy: list[int]) -> None:
        self.at: dict[int, dict[int, object]] = {}  # rank -> position -> its communication actor
        names: dict[int, dict[str, int]] = {}
        p2p: dict[tuple, int] = {}  # (type, rank, peer, tag) -> position
        for r in busy:
            row = self.at[r] = dict(plan.ranks[r].comm_items())
            names[r] = {a.name: i for i, a in row.items()}
            for i, a in row.items():
                if not isinstance(a, Collective):
                    p2p[(type(a) is Send, r, a.peer, a.tag)] = i  # type: ignore[attr-defined]
        groups: dict[tuple, tuple[tuple[int, int], ...]] = {}
        self.parties: dict[int, dict[int, tuple[tuple[int, int], ...]]] = {}
        for r, row in self.at.items():
            mine = self.parties[r] = {}
            for i, a in row.items():
                if isinstance(a, Collective):
                    key = (a.name, a.group)
                    got = groups.get(key)
                    if got is None:
                        got = groups[key] = tuple((m, names[m][a.name]) for m in a.group)
                    mine[i] = got
                else:  # the peer's matching receive (or send), and r itself
                    j = p2p[(type(a) is not Send, a.peer, r, a.tag)]  # type: ignore[attr-defined]
                    mine[i] = tuple(sorted(((r, i), (a.peer, j))))  # type: ignore[attr-defined]
        # one collective name on several groups (calibration's plans: every group runs "c0"): the full
        # simulation matches such collectives by name alone, so one tick's groups complete as one
        self.shared_names = len({name for name, _ in groups}) < len(groups)


def rank_classes(plan: ActorPlan, busy: list[int], comms: _Comms) -> dict[int, int]:
    """Rank -> its class (the number of its lowest member's first appearance), refined until every
    communication meets parties of the same classes at the same positions."""
    cls = _initial(plan, busy)
    n = len(set(cls.values()))
    while True:
        seen: dict[int, tuple] = {}

        def at(parts: tuple, cls: dict[int, int] = cls, seen: dict = seen) -> tuple:
            got = seen.get(id(parts))
            if got is None:
                got = seen[id(parts)] = (parts, tuple(sorted([(cls[m], j) for m, j in parts])))
            return got[1]

        number: dict[tuple, int] = {}
        new = {r: number.setdefault((cls[r], tuple([(i, at(p)) for i, p in comms.parties[r].items()])), len(number))
               for r in busy}
        if len(number) == n:
            return cls
        cls, n = new, len(number)


def derive_by_class(plan: ActorPlan, steps: int = 1) -> tuple[CommSlot, ...] | None:
    """``schedule.derive_comm_order`` simulating one rank per class; None where the classes are the ranks
    (nothing to save), where one collective name stands for several groups, or where the simulation gets
    stuck (the full one reports the deadlock)."""
    busy = [r for r, rp in plan.ranks.items() if rp.n_actors]
    if not busy:
        return None
    comms = _Comms(plan, busy)
    if comms.shared_names:
        return None
    cls = rank_classes(plan, busy, comms)
    members: dict[int, list[int]] = {}
    for r in busy:
        members.setdefault(cls[r], []).append(r)
    if len(members) == len(busy):
        return None
    reps = {c: ms[0] for c, ms in members.items()}
    graphs = {c: FiringGraph(plan.ranks[r].actors, plan.micro_batches, steps, plan.ranks[r].schedule)
              for c, r in reps.items()}
    try:
        return _simulate(plan, graphs, reps, members, cls, comms)
    finally:
        for g in graphs.values():
            g.unlink()


def _simulate(plan: ActorPlan, graphs: dict[int, FiringGraph], reps: dict[int, int], members: dict[int, list[int]],
              cls: dict[int, int], comms: _Comms) -> tuple[CommSlot, ...] | None:
    from .actor_plan import CommSlot, match_key

    micro = plan.micro_batches
    # per class and position of a communication: the classes and positions of its parties (one set for
    # every concrete communication its members hold there), and those concrete communications
    sets: dict[tuple[int, int], frozenset] = {}
    for c, r in reps.items():
        for i, parts in comms.parties[r].items():
            sets[(c, i)] = frozenset((cls[m], j) for m, j in parts)
    concrete: dict[frozenset, list[tuple[tuple, list[tuple[int, int, object]]]]] = {}

    def instances(s: frozenset) -> list[tuple[tuple, list[tuple[int, int, object]]]]:
        """(match key without the micro-batch, its parties (rank, position, actor) in rank order), sorted
        by key: every concrete communication whose parties are the members of ``s``'s classes there."""
        got = concrete.get(s)
        if got is None:
            found: dict[tuple, list[tuple[int, int, object]]] = {}
            for c, i in s:
                for m in members[c]:
                    a = comms.at[m][i]
                    key = match_key(m, a, 0)[:-1]  # type: ignore[arg-type]
                    if key not in found:
                        found[key] = sorted((p, j, comms.at[p][j]) for p, j in comms.parties[m][i])
            got = concrete[s] = sorted(found.items())
        return got

    comm = {c: [n.actor.lane == "comm" for n in g.nodes] for c, g in graphs.items()}
    per_micro = {c: [n.actor.scope == "micro" for n in g.nodes] for c, g in graphs.items()}
    waiting: dict[tuple, set] = {}  # (party set, micro) -> the (class, position) parties posted
    posted_at: dict[tuple[int, int], int] = {}  # (class, position) -> the tick it last posted in
    busy_until = {c: 0 for c in graphs}
    events: list[tuple[int, int, int]] = []
    order: list[CommSlot] = []
    dirty = {c: set(range(len(g.nodes))) for c, g in graphs.items()}
    ready = {c: ReadyQueue(g) for c, g in graphs.items()}
    posted = {c: [-1] * len(g.nodes) for c, g in graphs.items()}
    t = 0
    while any(g.unfinished for g in graphs.values()):
        complete: list[tuple[frozenset, int]] = []
        for c, g in graphs.items():
            d = dirty[c]
            if not d:
                continue
            nodes, can_fire, is_comm, offer, post = g.nodes, g.can_fire, comm[c], ready[c].offer, posted[c]
            for i in sorted(d):
                n = nodes[i]
                k = n.started
                if k >= n.total:
                    continue
                if not is_comm[i]:
                    offer(i)
                    continue
                if post[i] == k or not can_fire(i):
                    continue
                post[i] = k
                m = k % micro if per_micro[c][i] else -1
                s = sets[(c, i)]
                parts = waiting.setdefault((s, m), set())
                parts.add((c, i))
                posted_at[(c, i)] = t
                if len(parts) == len(s):
                    complete.append((s, m))
            d.clear()
        written = []  # ((priority, match key), slots) of every concrete communication completed now
        for s, m in complete:
            waiting.pop((s, m))
            for head, parts in instances(s):
                last = max(p for p, j, _ in parts if posted_at[(cls[p], j)] == t)
                j = next(j for p, j, _ in parts if p == last)
                c = cls[last]
                k = graphs[c].nodes[j].started
                o = getattr(comms.at[last][j], "order", 0)
                prio = (k // micro, k % micro, o, j) if per_micro[c][j] else (k, -1, o, j)
                slots = [CommSlot(p, a.name, m) for p, j, a in parts  # type: ignore[attr-defined]
                         if (graphs[cls[p]].nodes[j].started // micro if per_micro[cls[p]][j]
                             else graphs[cls[p]].nodes[j].started) == 0]
                written.append(((prio, head + (m,)), slots))
            for c, i in s:
                k = graphs[c].start(i)
                dirty[c].add(i)
                posted[c][i] = -1
                events.append((c, i, k))
        for _, slots in sorted(written, key=lambda w: w[0]):
            order.extend(slots)
        for c, g in graphs.items():
            if busy_until[c] <= t and ready[c]:
                i = ready[c].take()
                k = g.start(i)
                dirty[c].add(i)
                busy_until[c] = t + 1
                events.append((c, i, k))
        if not events:
            return None
        t += 1
        for c, i, k in events:
            dirty[c].update(graphs[c].finish(i, k))
        events.clear()
    return tuple(order)
