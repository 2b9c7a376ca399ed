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

import heapq
import itertools
from typing import TYPE_CHECKING

from .firing import FiringGraph
from .specs import PlanError

if TYPE_CHECKING:
    from .actor_plan import ActorPlan, CommSlot


def _priority(g: FiringGraph, i: int) -> tuple:
    node = g.nodes[i]
    k = node.started
    return (g.micro_of(node, k), getattr(node.actor, "order", 0), i)


def derive_comm_order(plan: ActorPlan, steps: int = 1) -> tuple[CommSlot, ...]:
    from .actor_plan import CommSlot, channel_of, match_key

    micro = plan.micro_batches
    graphs = {r: FiringGraph(rp.actors, micro, steps) for r, rp in plan.ranks.items()}
    members: dict[tuple, tuple[int, ...]] = {}
    for r, rp in plan.ranks.items():
        for a in rp.comm_actors:
            ch = channel_of(r, a)
            members[ch] = a.group if ch[0] == "group" else ch[1:]  # type: ignore[attr-defined]
    waiting: dict[tuple, dict[int, tuple[int, int]]] = {}  # match key -> {rank: (node, k)} ready there
    busy_until = {r: 0 for r in graphs}
    events: list[tuple[int, int, int, int, int]] = []  # (time, tiebreak, rank, node, k)
    tie = itertools.count()
    order: list[CommSlot] = []
    # Only actors whose counters changed can change their answer to ``can_fire`` (the rule is
    # monotone), so each tick re-checks those alone: linear in firings, not firings x actors.
    dirty = {r: set(range(len(g.nodes))) for r, g in graphs.items()}
    ready: dict[int, list[tuple]] = {r: [] for r in graphs}  # heap of (priority, actor): compute that can fire
    queued: dict[int, set[int]] = {r: set() for r in graphs}  # actors in ``ready``
    posted: set[tuple[int, int, int]] = set()  # (rank, node, firing) already waiting for its peers
    t = 0
    while not all(g.finished() for g in graphs.values()):
        complete: list[tuple] = []
        for r, g in graphs.items():
            for i in sorted(dirty[r]):
                n = g.nodes[i]
                if n.actor.lane != "comm":
                    if i not in queued[r] and g.can_fire(i):  # its priority holds until it starts
                        queued[r].add(i)
                        heapq.heappush(ready[r], (_priority(g, i), i))
                    continue
                if (r, i, n.started) in posted or not g.can_fire(i):
                    continue
                posted.add((r, i, n.started))
                m = g.micro_of(n, n.started) if n.actor.scope == "micro" else -1
                key = match_key(r, n.actor, m)
                parts = waiting.setdefault(key, {})
                parts[r] = (i, n.started)
                if len(parts) == len(members[channel_of(r, n.actor)]):
                    complete.append((_priority(g, i), key))
            dirty[r].clear()
        for _, key in sorted(complete):  # every member issues it now, so channels stay in step
            for r, (i, k) in sorted(waiting.pop(key).items()):
                g = graphs[r]
                g.start(i)
                dirty[r].add(i)
                posted.discard((r, i, k))
                a = g.nodes[i].actor
                if g.step_of(g.nodes[i], k) == 0:
                    order.append(CommSlot(r, a.name, g.micro_of(g.nodes[i], k) if a.scope == "micro" else -1))
                heapq.heappush(events, (t + 1, next(tie), r, i, k))
        for r, g in graphs.items():
            if busy_until[r] <= t and ready[r]:
                i = heapq.heappop(ready[r])[1]
                queued[r].discard(i)
                k = g.start(i)
                dirty[r].add(i)
                busy_until[r] = t + 1
                heapq.heappush(events, (t + 1, next(tie), r, i, k))
        if not events:
            raise PlanError(_deadlock_report(plan, graphs, waiting))
        t = events[0][0]
        while events and events[0][0] == t:
            _, _, r, i, k = heapq.heappop(events)
            dirty[r].update(graphs[r].finish(i, k))
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
    from .actor_plan import match_key

    M = plan.micro_batches
    graphs = {r: FiringGraph(rp.actors, M, 1) for r, rp in plan.ranks.items()}
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
