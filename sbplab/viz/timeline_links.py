"""What joins the firings of a timeline, and when a transfer really moved data.

Perfetto draws arrows between slices that belong together; a person reading a parallel run needs the
same: the members of one collective (every rank of its group fires the same ``c<k>`` actor for the same
firing) and a send and the receive it feeds (the trace's cross-rank register flow, ``Bar.source``).

A communication firing's slice runs from when its rank posted it to when it completed, so a posted
receive, or a collective whose peers are late, looks like a long busy bar. Data moves only once every
member has posted (a receive: once its send has) and once the rank's communication stream has
finished what it was doing before: ``transfer_starts`` gives that moment per firing, and the
timeline draws the stretch before it as waiting, apart from the transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .timeline_bars import Bar


def _firing(b: Bar) -> Any:
    return b.args.get("firing", (b.step, b.micro_batch))


def collective_instances(bars: Sequence[Bar]) -> list[list[int]]:
    """Indices into ``bars`` of each collective's members (one firing of one ``c<k>`` actor, every rank
    drawn), by rank; only instances with two members or more (one drawn rank has no one to join)."""
    groups: dict[tuple, list[int]] = {}
    for i, b in enumerate(bars):
        if b.kind == "collective":
            groups.setdefault((b.name, _firing(b)), []).append(i)
    return [sorted(ix, key=lambda i: (str(type(bars[i].rank)), bars[i].rank)) for ix in groups.values() if len(ix) > 1]


def p2p_pairs(bars: Sequence[Bar]) -> list[tuple[int, int]]:
    """(send, receive) index pairs: a receive whose trace flow names the send that fed it, both drawn."""
    where = {(b.rank, b.name, _firing(b)): i for i, b in enumerate(bars)}
    out = []
    for i, b in enumerate(bars):
        if b.source is not None and b.source in where and bars[where[b.source]].rank != b.rank:
            out.append((where[b.source], i))
    return out


def transfer_starts(bars: Sequence[Bar]) -> list[float]:
    """Per bar, when it began doing its work: its start for compute; for communication, once every
    member of its collective (a receive: its send) has posted and the rank's communication stream is
    free of the firings posted before it. Never before its start nor after its end."""
    ready = [b.start_us for b in bars]
    for ix in collective_instances(bars):
        last = max(bars[i].start_us for i in ix)
        for i in ix:
            ready[i] = last
    for s, r in p2p_pairs(bars):
        ready[r] = max(ready[r], bars[s].start_us)
    lanes: dict[tuple[Any, str], list[int]] = {}
    for i, b in enumerate(bars):
        if b.lane == "comm":
            lanes.setdefault((b.rank, b.lane), []).append(i)
    for ix in lanes.values():  # a stream moves one transfer at a time, in the order they were posted
        busy = float("-inf")
        for i in sorted(ix, key=lambda i: (bars[i].start_us, ready[i])):
            ready[i] = max(ready[i], busy)
            busy = max(busy, bars[i].end_us)
    return [min(max(r, b.start_us), b.end_us) for r, b in zip(ready, bars)]


def step_starts(bars: Sequence[Bar]) -> dict[int, float]:
    """Where each drawn step starts: its first forward kernel (a receive or a prefetch posted early, a
    source or a parameter firing ahead, do not start it); a step without one, its first firing."""
    first: dict[int, float] = {}
    forward: dict[int, float] = {}
    for b in bars:
        if b.step is None:
            continue
        first[b.step] = min(first.get(b.step, b.start_us), b.start_us)
        if b.kind == "forward" and b.lane == "compute" and not b.ahead and b.actor_kind not in ("state", "source"):
            forward[b.step] = min(forward.get(b.step, b.start_us), b.start_us)
    return {s: forward.get(s, first[s]) for s in sorted(first)}


@dataclass(frozen=True)
class Counter:
    """A counter track of one rank (Chrome ``C`` events): ``name`` sampled at ``t_us`` (driver clock)."""

    rank: Any
    name: str
    t_us: tuple[float, ...]
    values: tuple[float, ...]


def counters(events: Sequence[dict], given: Any = None) -> list[Counter]:
    """The memory counters to draw: ``given`` (rank -> [(t_us, bytes), ...]) when passed, else the trace's
    Chrome counter events (``ph: "C"``, one series per pid and name; the first numeric arg is the value)."""
    if given is not None:
        return [Counter(r, "memory", tuple(float(t) for t, _ in s), tuple(float(v) for _, v in s))
                for r, s in sorted(given.items(), key=lambda kv: str(kv[0])) if s]
    series: dict[tuple[Any, str], list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") != "C" or "ts" not in e:
            continue
        vals = [v for v in (e.get("args") or {}).values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if vals:
            series.setdefault((e.get("pid"), str(e.get("name", "counter"))), []).append((float(e["ts"]), float(vals[0])))
    return [Counter(r, n, tuple(t for t, _ in sorted(s)), tuple(v for _, v in sorted(s)))
            for (r, n), s in sorted(series.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))]


def critical_keys(x: Any) -> set[tuple[Any, str, Any]]:
    """(rank, actor, firing) of the firings on a Prediction's critical path (empty for anything else)."""
    path = getattr(x, "critical_path", None) if hasattr(x, "step_time") and hasattr(x, "firings") else None
    return {(e.rank, e.actor, e.firing) for e in path or ()}


def on_critical_path(bars: Sequence[Bar], keys: set) -> list[int]:
    return [i for i, b in enumerate(bars) if (b.rank, b.name, b.args.get("firing")) in keys]
