"""Derive a plan's global communication order by simulating its actors on all ranks at once.

Every rank runs the firing rule with a serial compute lane (one tick per firing). A communication
is issued at the moment every rank taking part can fire it (inputs ready, a register free) and
completes one tick later; all its members issue it together, so every channel sees the same
sequence everywhere. The order in which the simulation issued communication is the plan's
``comm_order``; the runtime issues it in that order without waiting for completions.

Because the firing rule is monotone (see ``firing.py``), an order that completed here completes
under any real timing. If the simulation gets stuck, the register counts (or the wiring) admit a
deadlock, and the error lists what each rank's blocked actors wait for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .firing import FiringGraph, ReadyQueue
from .schedule_classes import derive_by_class
from .schedule_uniform import derive_from_one, uniform_rank
from .specs import PlanError

if TYPE_CHECKING:
    from .actor_plan import ActorPlan, CommSlot


def derive_comm_order(plan: ActorPlan, steps: int = 1) -> tuple[CommSlot, ...]:
    """Simulate every rank tick by tick and return the order communication was issued in.

    Ties go by the firing rule's priority (``FiringGraph.priority``: step, micro-batch, the actor's
    ``order``, its index on its rank): each rank's compute lane fires its lowest ready priority (in a
    pipeline, within what the rank's schedule allows), and communication that became complete in the
    same tick is issued lowest priority (then match key) first. Where every rank runs the
    same actors (``schedule_uniform``), one rank is simulated and the same order rebuilt from it; where
    they are a few classes that move in lockstep (a pipeline's stages: ``schedule_classes``), one rank
    per class.
    """
    rep = uniform_rank(plan)
    if rep is not None:
        order = derive_from_one(plan, rep, steps)
        if order is not None:
            return order
    order = derive_by_class(plan, steps)
    return order if order is not None else derive_all(plan, steps)


def derive_all(plan: ActorPlan, steps: int = 1) -> tuple[CommSlot, ...]:
    """``derive_comm_order`` by simulating every rank (and the deadlock report where it is stuck)."""
    graphs = {r: FiringGraph(rp.actors, plan.micro_batches, steps, rp.schedule) for r, rp in plan.ranks.items()}
    try:
        return _simulate(plan, graphs)
    finally:
        for g in graphs.values():
            g.unlink()


def _simulate(plan: ActorPlan, graphs: dict[int, FiringGraph]) -> tuple[CommSlot, ...]:
    """``derive_comm_order`` on fresh firing graphs of every rank."""
    from .actor_plan import CommSlot, channel_of, match_key

    micro = plan.micro_batches
    members: dict[tuple, tuple[int, ...]] = {}
    for r, rp in plan.ranks.items():
        for a in rp.comm_actors:
            ch = channel_of(r, a)
            members[ch] = a.group if ch[0] == "group" else ch[1:]  # type: ignore[attr-defined]
    # per rank and actor, what the loop asks again and again: lane, scope, and for communication
    # its match key without the micro-batch and how many members its channel has
    comm: dict[int, list[bool]] = {}
    per_micro: dict[int, list[bool]] = {}
    key_head: dict[int, list[tuple | None]] = {}
    size: dict[int, list[int]] = {}
    for r, g in graphs.items():
        acts = [n.actor for n in g.nodes]
        comm[r] = [a.lane == "comm" for a in acts]
        per_micro[r] = [a.scope == "micro" for a in acts]
        key_head[r] = [match_key(r, a, 0)[:-1] if c else None for a, c in zip(acts, comm[r])]
        size[r] = [len(members[channel_of(r, a)]) if c else 0 for a, c in zip(acts, comm[r])]
    waiting: dict[tuple, dict[int, tuple[int, int]]] = {}  # match key -> {rank: (node, k)} ready there
    busy_until = {r: 0 for r in graphs}
    events: list[tuple[int, int, int]] = []  # (rank, node, k) finishing at the next tick, in issue order
    order: list[CommSlot] = []
    # Only actors whose counters changed can change their answer to ``can_fire`` (the rule is
    # monotone), so each tick re-checks those alone: linear in firings, not firings x actors.
    dirty = {r: set(range(len(g.nodes))) for r, g in graphs.items()}
    ready = {r: ReadyQueue(g) for r, g in graphs.items()}  # each rank's compute lane's choice
    posted = {r: [-1] * len(g.nodes) for r, g in graphs.items()}  # firing waiting for its peers, or -1
    t = 0
    while any(g.unfinished for g in graphs.values()):
        complete: list[tuple] = []
        for r, g in graphs.items():
            d = dirty[r]
            if not d:
                continue
            nodes, can_fire, is_comm, offer, post, prio = g.nodes, g.can_fire, comm[r], ready[r].offer, posted[r], \
                g.priority
            for i in sorted(d):
                n = nodes[i]
                k = n.started
                if k >= n.total:  # finished: ``can_fire`` says no
                    continue
                if not is_comm[i]:
                    offer(i)
                    continue
                if post[i] == k or not can_fire(i):
                    continue
                post[i] = k
                m = k % micro if per_micro[r][i] else -1
                key = key_head[r][i] + (m,)  # type: ignore[operator]
                parts = waiting.setdefault(key, {})
                parts[r] = (i, k)
                if len(parts) == size[r][i]:
                    complete.append((prio(i), key))
            d.clear()
        for _, key in sorted(complete):  # every member issues it now, so channels stay in step
            for r, (i, k) in sorted(waiting.pop(key).items()):
                g = graphs[r]
                g.start(i)
                dirty[r].add(i)
                posted[r][i] = -1
                if per_micro[r][i]:
                    if k // micro == 0:
                        order.append(CommSlot(r, g.nodes[i].actor.name, k % micro))
                elif k == 0:
                    order.append(CommSlot(r, g.nodes[i].actor.name, -1))
                events.append((r, i, k))
        for r, g in graphs.items():
            if busy_until[r] <= t and ready[r]:
                i = ready[r].take()
                k = g.start(i)
                dirty[r].add(i)
                busy_until[r] = t + 1
                events.append((r, i, k))
        if not events:
            raise PlanError(_deadlock_report(plan, graphs, waiting))
        t += 1  # every firing takes one tick: all of them finish now
        for r, i, k in events:
            dirty[r].update(graphs[r].finish(i, k))
        events.clear()
    return tuple(order)


def _deadlock_report(plan: ActorPlan, graphs: dict[int, FiringGraph], issued: dict) -> str:
    lines = [f"plan {plan.name!r} deadlocks: no actor can fire and no communication can complete."]
    for key, parts in issued.items():
        who = ", ".join(f"rank {r} ({graphs[r].nodes[i].actor.name})" for r, (i, _) in parts.items())
        lines.append(f"  communication {key} is ready only on {who}")
    for r, g in graphs.items():
        for n in g.nodes:
            if n.done_upto < n.total and n.started == n.done_upto:
                lines.append(f"  rank {r}: {n.actor.name} (firing {n.started}) waits for "
                             f"{g.waiting_for(n.index)}")
    lines.append("More registers on the waiting actors' producers usually resolve it.")
    return "\n".join(lines[:60])


def check_comm_order(plan: ActorPlan) -> None:
    """Replay one step with the plan's given ``comm_order``; raise if it cannot finish.

    Every rank fires whatever compute is ready and posts its communication in order without waiting;
    a communication completes once all its members posted it. The firing rule is monotone, so the
    state where this gets stuck is the same under every timing: one replay decides.
    """
    graphs = {r: FiringGraph(rp.actors, plan.micro_batches, 1, rp.schedule) for r, rp in plan.ranks.items()}
    try:
        _replay(plan, graphs)
    finally:
        for g in graphs.values():
            g.unlink()


def _replay(plan: ActorPlan, graphs: dict[int, FiringGraph]) -> None:
    """``check_comm_order`` on fresh firing graphs of every rank."""
    from .actor_plan import match_key

    order = {r: [(graphs[r].names[a], m) for a, m in plan.rank_order(r)] for r in plan.ranks}
    pos = {r: 0 for r in plan.ranks}
    size: dict[tuple, int] = {}
    for slot in plan.comm_order or ():
        key = match_key(slot.rank, plan.ranks[slot.rank].by_name[slot.actor], slot.micro)
        size[key] = size.get(key, 0) + 1
    posted: dict[tuple, list[tuple[int, int, int]]] = {}
    while not all(g.finished() for g in graphs.values()):
        moved = False
        for r, g in graphs.items():
            for i, n in enumerate(g.nodes):
                while n.actor.lane != "comm" and g.can_fire(i):
                    g.finish(i, g.start(i))
                    moved = True
            while pos[r] < len(order[r]) and g.can_fire(order[r][pos[r]][0]):
                i, m = order[r][pos[r]]
                pos[r] += 1
                posted.setdefault(match_key(r, g.nodes[i].actor, m), []).append((r, i, g.start(i)))
                moved = True
        for key in [k for k, parts in posted.items() if len(parts) == size[k]]:
            for r, i, k in posted.pop(key):
                graphs[r].finish(i, k)
            moved = True
        if not moved:
            waiting = {key: {r: (i, k) for r, i, k in parts} for key, parts in posted.items()}
            raise PlanError(_deadlock_report(plan, graphs, waiting).replace(
                "deadlocks:", "deadlocks with its given comm_order:", 1))
