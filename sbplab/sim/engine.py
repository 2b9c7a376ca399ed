"""The discrete-event loop: every rank's actors under the runtime's own firing rule, on simulated time.

What is the same as a real run (``runtime/executor.py``): the FiringGraph counters (inputs ready, a
register free, in a pipeline the rank's schedule), the registers and micro-batches, one compute lane
per rank that picks the ready firing of lowest ``FiringGraph.priority`` (oldest step and micro-batch), and communication posted strictly in the plan's
``comm_order`` as soon as its inputs and a register allow. What is modelled: a communication
starts when every member has posted it and every member's comm lane is free (transfers of one rank
go one after another, in the order they became possible), and takes the boxing kind's duration;
a compute firing takes its cost (see ``firing_cost.py``).

Cores: with ``cores`` set (CPU ranks as processes sharing a machine), the ``k`` ranks computing at
a moment each run at ``min(1, cores / k)`` of full speed (processor sharing). It is done with a
virtual clock that advances at that rate, so a firing's end never needs rescheduling. Gloo's
transfers also use CPU, but mostly waiting on sockets and shared memory; their CPU share is inside
the measured alpha-beta fits, so they do not count as busy ranks here (counting them would charge
the same cost twice). What computing ranks do cost a transfer is the wait for a core: each round
of it needs the backend's threads to run, and the kernel's scheduler lets a woken thread wait up to
a tick while every core computes. So a transfer that starts while every core computes takes its
``busy_extra`` longer (measured that way), unless a core comes free first: then it ends at its
quiet time, or at once if that has passed, and the transfers queued behind it on a comm lane move up
with it (they start when their lanes are free and run at their quiet time).

Events happening at one instant are all applied before any rank decides what to start, so the
order of simultaneous completions does not change the schedule. Each firing records the firing
whose completion let it start (``cause``), which is what the critical path walks back along.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass

from ..runtime.actor_plan import ActorPlan
from ..runtime.firing import FiringGraph, ReadyQueue
from ..runtime.specs import Collective
from .symmetry import Lookup

COMPUTE, COMM = 0, 1
INF = float("inf")


@dataclass
class Firings:
    """Every simulated firing, as parallel arrays indexed by firing id (cheap for 10^5..10^6 firings).

    start: compute start, or the moment a communication was posted (as a run's trace records it).
    xfer: when the transfer itself began (every member posted, lanes free); = start for compute.
    cause: the firing whose completion let this one start (-1: ready at time 0).
    """

    rank: array
    node: array
    k: array
    lane: array
    start: array
    xfer: array
    end: array
    cause: array
    # registers: (rank, node, alloc time, release time) per produced output, for the memory sweep
    reg_rank: array
    reg_node: array
    reg_alloc: array
    reg_free: array

    def __len__(self) -> int:
        return len(self.rank)


class Engine:
    """Runs ``plan`` for ``steps`` steps on the representative ranks of ``classes``.

    work[r][i]: compute seconds at full speed (compute lane) or transfer seconds (comm lane) of one
        firing of actor i on rank r.
    busy_extra[r][i]: how much longer that transfer takes while every core computes.
    classes: representative rank -> the ranks it stands for (see ``symmetry.py``): ranks of one
        class run the same actors with the same costs, so they fire at the same times and only the
        representative is simulated. A communication of a representative waits for the posts of the
        representatives of every rank taking part (each class's comm lane is its representative's).
    """

    def __init__(self, plan: ActorPlan, steps: int, work: dict[int, list[float]], cores: int | None,
                 classes: dict[int, list[int]], busy_extra: dict[int, list[float]] | None = None,
                 device_type: str | None = None) -> None:
        self.plan, self.steps, self.work, self.cores = plan, steps, work, cores
        self.device_type = plan.device_type or device_type or "cpu"  # a device-free plan: the hardware's
        self.busy_extra = busy_extra if busy_extra and any(any(row) for row in busy_extra.values()) else None
        self.classes = classes
        M = plan.micro_batches
        self.reps = sorted(classes)
        self.graphs = {r: FiringGraph(plan.ranks[r].actors, M, steps, plan.ranks[r].schedule) for r in self.reps}
        rep_of = {m: r for r, ms in classes.items() for m in ms}
        # communication as (rep, actor index) pairs: which posts each one waits for, and the reverse
        self.needs: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        self.waiters: dict[tuple[int, int], list[tuple[int, int]]] = {}
        lookup = Lookup(plan)
        for r in self.reps:
            rp = plan.ranks[r]
            for i, a in enumerate(rp.actors):
                if a.lane != "comm":
                    continue
                parts = {(r, i)}
                if isinstance(a, Collective):
                    for m in a.group:
                        parts.add((rep_of[m], lookup.index(m, a.name)))
                else:
                    peer = a.peer  # type: ignore[attr-defined]
                    parts.add((rep_of[peer], lookup.partner(r, a)))
                self.needs[(r, i)] = tuple(sorted(parts))
                for q in parts:
                    self.waiters.setdefault(q, []).append((r, i))
        self.order = {r: [(self.graphs[r].names[a], m) for a, m in plan.rank_order(r)] for r in self.reps}
        f = "d"
        self.out = Firings(array("i"), array("i"), array("i"), array("b"), array(f), array(f), array(f),
                           array("i"), array("i"), array("i"), array(f), array(f))

    def run(self) -> Firings:  # noqa: C901 - one loop, kept in one place for speed (locals, no attribute look-ups)
        plan, steps = self.plan, self.steps
        graphs, work, out = self.graphs, self.work, self.out
        o_rank, o_node, o_k, o_lane = out.rank.append, out.node.append, out.k.append, out.lane.append
        o_start, o_xfer, o_end, o_cause = out.start.append, out.xfer, out.end, out.cause
        o_end_app, o_cause_app, o_xfer_app = o_end.append, o_cause.append, o_xfer.append
        out_rank, out_node, out_lane, out_k = out.rank, out.node, out.lane, out.k
        cores = self.cores if self.device_type == "cpu" else None
        extra = self.busy_extra if cores is not None else None
        weight = {r: len(ms) for r, ms in self.classes.items()}
        events: list[tuple[float, int, int]] = []  # (real time, seq, firing id): transfers
        vevents: list[tuple[float, int, int]] = []  # (virtual time, seq, firing id): compute
        seq = 0
        now, V, busy_count = 0.0, 0.0, 0
        rate = 1.0
        ready = {r: ReadyQueue(g) for r, g in graphs.items()}  # each rank's compute lane's choice
        busy = {r: False for r in self.reps}
        cpos = {r: 0 for r in self.reps}
        cstep = {r: 0 for r in self.reps}
        last = {r: -1 for r in self.reps}  # latest firing that finished on the rank
        lane_free = {r: 0.0 for r in self.reps}
        lane_last = {r: -1 for r in self.reps}
        needs, waiters = self.needs, self.waiters
        posted_at: dict[tuple[int, int, int], int] = {}  # (rep, actor, firing) -> firing id, while unmatched
        possible: list[tuple[tuple[int, int], int]] = []  # communication all of whose members posted, this instant
        # transfers not yet over while cores can be busy, in the order they were scheduled:
        # [quiet seconds, {rank: firing}, start, end]; one slowed by busy cores sets ``slowed``
        pending: list[list] = []
        slowed = False
        due: dict[int, float] = {}  # the current ends of transfers ``release`` moved (-1: over)
        count: dict[tuple[int, int, int], int] = {}
        # registers: per (rank, node) the ids of outputs still alive, in order; released counters seen
        seen_rel = {r: [0] * len(g.nodes) for r, g in graphs.items()}
        live: dict[int, list[list[int]]] = {r: [[] for _ in g.nodes] for r, g in graphs.items()}
        produces = {r: [n.n_out > 0 for n in g.nodes] for r, g in graphs.items()}
        allocated_regs = {r: [0] * len(g.nodes) for r, g in graphs.items()}
        r_rank, r_node, r_alloc, r_free = out.reg_rank, out.reg_node, out.reg_alloc, out.reg_free

        def new_firing(r: int, i: int, k: int, lane: int, cause: int) -> int:
            fid = len(out_rank)
            o_rank(r), o_node(i), o_k(k), o_lane(lane), o_start(now), o_xfer_app(now), o_end_app(INF)
            o_cause_app(cause)
            if produces[r][i]:
                g = graphs[r]
                reg = g.register_number(g.nodes[i], k)
                if reg is not None and reg >= allocated_regs[r][i]:  # a register is taken now
                    allocated_regs[r][i] = reg + 1
                    live[r][i].append(len(r_rank))
                    r_rank.append(r), r_node.append(i), r_alloc.append(now), r_free.append(INF)
            return fid

        def post(r: int, i: int, k: int, fid: int) -> None:
            """Record a post; a communication whose members have now all posted waits for ``start_all``."""
            posted_at[(r, i, k)] = fid
            for w in waiters[(r, i)]:
                key = (w[0], w[1], k)
                c = count.get(key, 0) + 1
                if c == len(needs[w]):
                    count.pop(key, None)
                    possible.append((w, k))
                else:
                    count[key] = c

        def start_all() -> None:
            """Start the communication that became possible at this instant, first posted first: each
            transfer begins when every member's lane is free. Taking them in the order of their first
            post, not of which rank's post came last, makes the schedule independent of the order ranks
            are visited in (ranks alike, simulated once, then fire exactly as when all are simulated)."""
            nonlocal seq, slowed
            transfers: dict[tuple, list[tuple[int, int]]] = {}
            for w, k in possible:
                transfers.setdefault((needs[w], k), []).append(w)
            possible.clear()
            firsts = sorted((min(posted_at[(q[0], q[1], k)] for q in parts), parts, k)
                            for (parts, k) in transfers)
            full = extra is not None and busy_count >= cores
            for _, parts, k in firsts:
                start, cause, dur, slow = now, -1, 0.0, 0.0
                last_post = max(posted_at[(q[0], q[1], k)] for q in parts)
                cause = o_cause[last_post]
                for q in parts:
                    if lane_free[q[0]] > start:
                        start, cause = lane_free[q[0]], lane_last[q[0]]
                    if work[q[0]][q[1]] > dur:
                        dur = work[q[0]][q[1]]
                    if full and extra[q[0]][q[1]] > slow:
                        slow = extra[q[0]][q[1]]
                end, members = start + dur + slow, {}
                for w in transfers[(parts, k)]:
                    f = posted_at.pop((w[0], w[1], k))
                    o_xfer[f], o_cause[f] = start, cause
                    if end > lane_free[w[0]]:
                        lane_free[w[0]], lane_last[w[0]] = end, f
                    seq += 1
                    heapq.heappush(events, (end, seq, f))
                    if extra is not None:
                        members[w[0]] = f
                if extra is not None:
                    if len(pending) > 256:  # drop the ones over (no core came free meanwhile)
                        pending[:] = [tr for tr in pending if tr[3] > now]
                    pending.append([dur, members, start, end])
                    slowed = slowed or bool(slow)

        def release() -> None:
            """A core came free: the transfers that waited for one end at their quiet time, or now, and
            those queued behind them on a comm lane start when the lane is free now, not at the end the
            slowed transfer would have had. (Left alone, each queued transfer would start after its
            predecessor's slowed end: the slowdowns of a lane would add up long after the cores freed.)"""
            nonlocal seq, slowed
            lane_end: dict[int, tuple[float, int]] = {}  # rank -> (end, firing) of its latest transfer so far
            for tr in pending:
                dur, members, start, end = tr
                if end <= now:
                    continue
                if start > now:  # queued behind another transfer: it starts when its lanes are free
                    start = max([now] + [lane_end[q][0] for q in members if q in lane_end])
                new_end = max(now, start + dur)
                if new_end < end:
                    tr[2], tr[3] = start, new_end
                    for f in members.values():
                        due[f], o_xfer[f] = new_end, start
                        seq += 1
                        heapq.heappush(events, (new_end, seq, f))
                for q, f in members.items():
                    lane_end[q] = (tr[3], f)
            for q, (end, f) in lane_end.items():
                if lane_last[q] == f:
                    lane_free[q] = end
            pending[:] = [tr for tr in pending if tr[3] > now]
            slowed = False

        def schedule(r: int) -> None:
            nonlocal seq, busy_count, rate
            g = graphs[r]
            order = self.order[r]
            while cstep[r] < steps and order:
                i, _m = order[cpos[r]]
                if not g.can_fire(i):
                    break
                k = g.start(i)
                post(r, i, k, new_firing(r, i, k, COMM, last[r]))
                cpos[r] += 1
                if cpos[r] == len(order):
                    cpos[r], cstep[r] = 0, cstep[r] + 1
            rq = ready[r]
            if not busy[r] and rq:
                i = rq.take()
                k = g.start(i)
                fid = new_firing(r, i, k, COMPUTE, last[r])
                busy[r] = True
                busy_count += weight[r]
                if cores is not None:
                    rate = 1.0 if busy_count <= cores else cores / busy_count
                seq += 1
                heapq.heappush(vevents, (V + work[r][i], seq, fid))

        def finish(fid: int) -> int:
            nonlocal busy_count, rate
            r, i = out_rank[fid], out_node[fid]
            o_end[fid] = now
            last[r] = fid
            if out_lane[fid] == COMPUTE:
                busy[r] = False
                busy_count -= weight[r]
                if cores is not None:
                    rate = 1.0 if busy_count <= cores else cores / max(busy_count, 1)
            g = graphs[r]
            nodes, sr, lv, offer = g.nodes, seen_rel[r], live[r], ready[r].offer
            for t in g.finish(i, out_k[fid]):
                rel = nodes[t].released
                while sr[t] < rel:  # outputs every consumer has acked: their registers are free
                    sr[t] += 1
                    if lv[t]:
                        r_free[lv[t].pop(0)] = now
                offer(t)
            return r

        for r in self.reps:
            for i in range(len(graphs[r].nodes)):
                ready[r].offer(i)
        for r in self.reps:
            schedule(r)
        start_all()
        if slowed and busy_count < cores:
            release()
        while events or vevents:
            t_real = events[0][0] if events else INF
            t_virt = now + (vevents[0][0] - V) / rate if vevents else INF
            if t_virt <= t_real:
                V, now = vevents[0][0], max(now, t_virt)
            else:
                V += (t_real - now) * rate
                now = t_real
            dirty = set()
            while events and events[0][0] <= now:
                t, _, f = heapq.heappop(events)
                if f in due:
                    if due[f] != t:
                        continue  # a transfer that ended early (or is over): this was its old end
                    due[f] = -1.0
                dirty.add(finish(f))
            while vevents and vevents[0][0] <= V:
                dirty.add(finish(heapq.heappop(vevents)[2]))
            for r in sorted(dirty):
                schedule(r)
            start_all()
            if slowed and busy_count < cores:
                release()
        stuck = [r for r, g in graphs.items() if not g.finished()]
        if stuck:
            from .sim_errors import SimulationError

            g = graphs[stuck[0]]
            why = [f"{n.actor.name!r} firing {n.started} waits for {g.waiting_for(n.index)}"
                   for n in g.nodes if n.done_upto < n.total][:4]
            raise SimulationError(f"simulation of plan {plan.name!r} stopped with ranks {stuck} unfinished: "
                                  + "; ".join(why))
        return out
