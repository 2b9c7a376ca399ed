"""Trace: every actor firing of a run on one clock, and its Chrome / Perfetto JSON.

Workers time firings with their own monotonic clock; the driver measures each worker's clock
offset at the start of a run (NTP-style: the ping with the shortest round trip wins) and moves
every event onto its own clock, so firings on different ranks line up. Times are microseconds
from the start of the run. A communication firing runs from its posting to the moment the
scheduler saw it finish: a collective as soon as the scheduler passes by, a send or a recv when
the scheduler next waits for it (it only waits when it has nothing to compute, oldest first), so
a transfer that finished while kernels ran shows as lasting until the compute lane fell idle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .firing import FiringGraph
from .specs import Actor, Collective, Recv, Send

if TYPE_CHECKING:
    from .actor_plan import ActorPlan

LANES = ("compute", "comm")


@dataclass(frozen=True)
class TraceEvent:
    """One firing: ``rank`` ran ``actor`` (``op``) on ``lane`` from ``start`` to ``end`` (us)."""

    rank: int
    lane: str
    actor: str
    op: str
    kind: str  # compute, collective, send, recv, source, sink, state, accumulate
    phase: str  # forward, backward, update
    step: int
    micro: int  # micro-batch within the step; -1 for step-scope actors
    firing: int
    start: float
    end: float
    bytes: int = 0
    mesh_axis: int | None = None  # a collective's mesh axis (None: not a collective, or a hand-built plan)
    group: tuple[int, ...] = ()  # ranks taking part: a collective's group, (sender, receiver) of a transfer

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class Trace:
    """Events sorted by start time, plus flows ``(producer event, consumer event)`` for registers."""

    events: list[TraceEvent] = field(default_factory=list)
    flows: list[tuple[int, int]] = field(default_factory=list)
    offsets_us: dict[int, float] = field(default_factory=dict)  # worker clock minus driver clock
    t0_ns: int = 0  # the driver clock at the run's start, time 0 of every event

    def memory_series(self, memory: dict[int, Any]) -> dict[int, list[tuple[float, int]]]:
        """Per rank, ``[(time_us, bytes held), ...]`` on this trace's clock, from a run's measured memory
        (``RunResult.memory``: each rank's samples on its own clock, moved by its measured offset)."""
        out: dict[int, list[tuple[float, int]]] = {}
        for r, m in memory.items():
            off = self.offsets_us.get(r, 0.0) * 1e3 + self.t0_ns
            out[r] = [((t - off) / 1e3, int(v)) for t, v in getattr(m, "samples", ())]
        return {r: s for r, s in out.items() if s}

    def __len__(self) -> int:
        return len(self.events)

    def select(self, rank: int | None = None, lane: str | None = None,
               actor: str | None = None) -> list[TraceEvent]:
        """The events of one rank, lane and/or actor, in start order."""
        return [e for e in self.events if (rank is None or e.rank == rank)
                and (lane is None or e.lane == lane) and (actor is None or e.actor == actor)]

    @property
    def span_us(self) -> float:
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def summary(self) -> str:
        """Per rank and lane: firings, busy time and bytes moved; a first look before the timeline."""
        rows: dict[tuple[int, str], list[float]] = {}
        for e in self.events:
            row = rows.setdefault((e.rank, e.lane), [0, 0.0, 0])
            row[0] += 1
            row[1] += e.dur
            row[2] += e.bytes
        lines = [f"trace: {len(self.events)} firings over {self.span_us / 1e3:.2f} ms",
                 f"{'rank':>4} {'lane':8s} {'firings':>8} {'busy ms':>9} {'MB moved':>9}"]
        for (r, lane), (n, busy, nb) in sorted(rows.items()):
            lines.append(f"{r:>4} {lane:8s} {n:>8} {busy / 1e3:>9.2f} {nb / 2**20:>9.2f}")
        return "\n".join(lines)

    def to_dicts(self) -> list[dict]:
        return [asdict(e) for e in self.events]

    def to_chrome(self, path: str | Path | None = None, memory: dict[int, Any] | None = None) -> dict:
        """Chrome trace JSON (opens in Perfetto): pid = rank, tid = lane, flow arrows for registers, and
        with ``memory=result.memory`` a counter track per rank of the bytes it held.

        Overlapping communication (several transfers in flight) is spread over extra rows of the
        comm lane, because trace viewers expect the slices of one thread to nest.
        """
        rows = _pack_rows(self.events)
        out: list[dict] = []
        seen: set[tuple[int, int]] = set()
        for i, e in enumerate(self.events):
            tid = rows[i]
            if (e.rank, tid) not in seen:
                seen.add((e.rank, tid))
                base = LANES[tid] if tid < 2 else f"comm {tid - 1}"
                out.append({"ph": "M", "name": "thread_name", "pid": e.rank, "tid": tid,
                            "args": {"name": base}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": e.rank, "tid": tid,
                            "args": {"sort_index": tid}})
            args = {"op": e.op, "kind": e.kind, "step": e.step, "micro": e.micro, "firing": e.firing,
                    "bytes": e.bytes}
            if e.mesh_axis is not None:
                args["mesh_axis"] = e.mesh_axis
            if e.group:
                args["group"] = list(e.group)
            out.append({"ph": "X", "name": e.actor, "cat": e.phase, "pid": e.rank, "tid": tid,
                        "ts": round(e.start, 3), "dur": round(max(e.dur, 0.001), 3), "args": args})
        for r in sorted({e.rank for e in self.events}):
            out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        for n, (a, b) in enumerate(self.flows):
            ea, eb = self.events[a], self.events[b]
            out.append({"ph": "s", "id": n, "name": "register", "cat": "register", "pid": ea.rank,
                        "tid": rows[a], "ts": round(max(ea.start, ea.end - 0.001), 3)})
            out.append({"ph": "f", "bp": "e", "id": n, "name": "register", "cat": "register", "pid": eb.rank,
                        "tid": rows[b], "ts": round(eb.start, 3)})
        for r, series in self.memory_series(memory or {}).items():
            out += [{"ph": "C", "name": "memory", "pid": r, "ts": round(t, 3), "args": {"bytes": v}} for t, v in series]
        doc = {"traceEvents": out, "displayTimeUnit": "ms"}
        if path is not None:
            Path(path).write_text(json.dumps(doc))
        return doc


def _pack_rows(events: list[TraceEvent]) -> list[int]:
    """Row per event: compute lane is 0; comm events go to row 1, or 2, 3, ... when they overlap."""
    rows = [0] * len(events)
    ends: dict[int, list[float]] = {}
    for i in sorted(range(len(events)), key=lambda i: events[i].start):
        e = events[i]
        if e.lane != "comm":
            continue
        lanes = ends.setdefault(e.rank, [])
        for j, end in enumerate(lanes):
            if end <= e.start:
                lanes[j] = e.end
                rows[i] = 1 + j
                break
        else:
            lanes.append(e.end)
            rows[i] = len(lanes)
    return rows


def _where(rank: int, a: Actor) -> tuple[int | None, tuple[int, ...]]:
    """(mesh axis, ranks taking part) of a communication actor, so pictures tell the groups apart."""
    if isinstance(a, Collective):
        return a.mesh_axis, a.group
    if isinstance(a, Send):
        return None, (rank, a.peer)
    if isinstance(a, Recv):
        return None, (a.peer, rank)
    return None, ()


def build_trace(plan: ActorPlan, steps: int, raw: dict[int, list[tuple]], offsets_ns: dict[int, int],
                t0_ns: int) -> Trace:
    """Turn per-rank raw firings ``(node, k, lane, t0, t1, bytes)`` into a Trace on the driver clock."""
    M = plan.micro_batches
    events: list[TraceEvent] = []
    graphs = {r: FiringGraph(rp.actors, M, steps) for r, rp in plan.ranks.items()}
    for r, rows in raw.items():
        g = graphs[r]
        off = offsets_ns.get(r, 0)
        for i, k, lane, a0, a1, nb in rows:
            n = g.nodes[i]
            a = n.actor
            start, end = (a0 - off - t0_ns) / 1e3, (a1 - off - t0_ns) / 1e3
            events.append(TraceEvent(r, LANES[lane], a.name, a.label, a.kind, a.phase, g.step_of(n, k),
                                     g.micro_of(n, k), k, start, end, nb, *_where(r, a)))
    events.sort(key=lambda e: (e.start, e.rank))
    index = {(e.rank, e.actor, e.firing): i for i, e in enumerate(events)}
    sender = {(r, a.peer, a.tag): a.name for r, rp in plan.ranks.items() for a in rp.actors
              if isinstance(a, Send)}
    flows: list[tuple[int, int]] = []
    for ci, e in enumerate(events):
        g = graphs[e.rank]
        node = g.nodes[g.names[e.actor]]
        for p, _, mode in node.inputs:
            o = g.in_number(mode, e.firing)
            if o is None:
                continue
            prod = g.nodes[p]
            kp = o * M + M - 1 if prod.actor.out_scope != prod.actor.scope else o
            pi = index.get((e.rank, prod.actor.name, kp))
            if pi is not None:
                flows.append((pi, ci))
        if isinstance(node.actor, Recv):
            name = sender.get((node.actor.peer, e.rank, node.actor.tag))
            pi = index.get((node.actor.peer, name, e.firing))
            if pi is not None:
                flows.append((pi, ci))
    return Trace(events, flows, {r: o / 1e3 for r, o in offsets_ns.items()}, t0_ns)
