"""The firings of a trace as bars: one lane per rank and stream, kinds, steps, idle gaps.

The input is the one trace format of the project (Chrome/Perfetto JSON events: ``pid`` = rank,
``tid`` = lane, ``ts``/``dur`` in microseconds, ``args`` with op, kind, step, micro, bytes, mesh
axis and group), so anything Perfetto opens we can draw, and the bars are exactly the trace's
complete events. A rank has two streams, compute and communication: the Chrome export spreads
overlapping transfers over numbered rows (``comm 1``, ``comm 2``) because trace viewers want the
slices of a thread to nest; here they fold back into one communication lane, where overlapping
firings sit side by side as thinner bars (``level`` of ``levels``), so a rank's row count does not
grow with the number of collectives in flight.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..boxing import kinds as boxing_kinds
from ..errors import InputError, InputTypeError
from .flows import ahead_of, flow_pairs

KINDS = ("forward", "backward", "update", "collective", "p2p", "other")
STREAMS = ("compute", "comm")
_COMM_LANE = re.compile(r"^(comm|communication|collective|p2p|nccl|gloo)\b", re.I)


@dataclass(frozen=True)
class Bar:
    """One actor firing, as drawn: a complete (``X``) event or a matched ``B``/``E`` pair."""

    rank: Any  # the event's pid
    lane: str  # the stream: "compute" or "comm"
    name: str  # the actor
    kind: str  # one of KINDS
    start_us: float
    dur_us: float
    micro_batch: int | None
    args: dict
    step: int | None = None
    mesh_axis: int | None = None  # collectives: the mesh axis their group runs on, when the trace says
    group: tuple = ()  # ranks taking part in a communication
    level: int = 0  # overlapping firings of one lane: which of ``levels`` side-by-side slots this one takes
    levels: int = 1
    actor_kind: str = field(default="", compare=False)  # the runtime's actor kind (compute, state, ...)
    ahead: bool | None = field(default=None, compare=False)  # reads nothing its step computed (flows.py)
    # a receive: (rank, actor, firing) of the send on another rank whose flow feeds it (timeline_links.py)
    source: tuple | None = field(default=None, compare=False)

    @property
    def row(self) -> str:
        return f"rank {self.rank} · {self.lane}"

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def trace_events(trace: Any) -> list[dict]:
    """The Chrome events of a runtime Trace (``.to_chrome()``), a run's or a prediction's ``.trace``,
    a Chrome JSON dict or file, an object with ``.events`` holding Chrome event dicts or TraceEvents,
    or a plain list of events."""
    if isinstance(trace, (str, Path)):
        trace = json.loads(Path(trace).read_text())
    elif not hasattr(trace, "events") and not hasattr(trace, "to_chrome") and hasattr(trace, "trace"):
        trace = trace.trace  # a RunResult or a Prediction
    if hasattr(trace, "to_chrome"):
        trace = trace.to_chrome()
    if isinstance(trace, dict):
        if "traceEvents" not in trace:
            raise InputError("a Chrome trace dict needs a 'traceEvents' list")
        trace = trace["traceEvents"]
    elif hasattr(trace, "events"):
        trace = trace.events
    out = []
    for i, ev in enumerate(trace):
        if dataclasses.is_dataclass(ev) and all(hasattr(ev, k) for k in ("rank", "lane", "start", "end")):
            ev = _from_record(ev)  # a runtime TraceEvent, e.g. from trace.select(rank=0)
        if not isinstance(ev, dict):
            raise InputTypeError(f"trace event {i} is a {type(ev).__name__}, expected a dict of Chrome trace "
                                 f"fields or a runtime TraceEvent")
        out.append(ev)
    return out


def _from_record(e: Any) -> dict:
    args = {k: getattr(e, k) for k in ("op", "kind", "step", "micro", "firing", "bytes", "mesh_axis") if hasattr(e, k)}
    if getattr(e, "group", ()):
        args["group"] = list(e.group)
    return {"ph": "X", "pid": e.rank, "tid": e.lane, "name": getattr(e, "actor", getattr(e, "op", "?")),
            "cat": getattr(e, "phase", ""), "ts": e.start, "dur": e.end - e.start, "args": args}


def _boxing_kind(name: str) -> Any:
    """The registered boxing kind an op name is (``all_reduce(max)`` too), or None."""
    return boxing_kinds.KINDS.get(str(name).split("(")[0])


def event_kind(ev: dict, lane: str = "") -> str:
    """forward / backward / update / collective / p2p / other.

    The runtime's actor kind says it (``collective``, ``send``, ``recv``); else a registered boxing
    kind named by the op (asked whether it is a collective or a point-to-point move); else the lane
    (a communication lane) or the phase.
    """
    args = ev.get("args") or {}
    kind = args.get("kind")
    if kind in KINDS:
        return kind
    if kind == "communication":
        return "collective"
    if kind in ("send", "recv") or (not kind and args.get("op") in ("send", "recv")):
        return "p2p"  # the runtime's point-to-point actor kinds
    for name in (args.get("op"), ev.get("name")):
        k = _boxing_kind(name) if name else None
        if k is not None and k.moves_data:
            return "collective" if k.is_collective else "p2p"
    if kind in (None, "") and _COMM_LANE.match(lane or ""):
        return "collective"
    for v in (args.get("phase"), ev.get("cat")):
        if v in ("forward", "backward", "update"):
            return v
    return "other"


def stream_of(lane: str, kind: str) -> str:
    """compute or comm: communication kinds and communication lanes (``comm 3`` too) are comm."""
    return "comm" if kind in ("collective", "p2p") or _COMM_LANE.match(lane or "") else "compute"


def _lane_names(events: Sequence[dict]) -> dict[tuple[Any, Any], str]:
    return {(e.get("pid"), e.get("tid")): str((e.get("args") or {}).get("name", e.get("tid")))
            for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def timeline_bars(trace: Any) -> list[Bar]:
    """Every firing of ``trace`` as a Bar, by start time, overlapping ones of a lane given levels.

    Metadata, flow, instant and counter events are skipped: they are not firings.
    """
    events = trace_events(trace)
    names = _lane_names(events)
    open_: dict[tuple[Any, Any], list[dict]] = {}
    bars: list[Bar] = []
    where: list[tuple[Any, Any]] = []  # (pid, tid) of each bar, to find the firings flows join

    def bar(ev: dict, start: float, dur: float) -> Bar:
        where.append((ev.get("pid"), ev.get("tid")))
        lane = names.get((ev.get("pid"), ev.get("tid")), str(ev.get("tid", 0)))
        args = dict(ev.get("args") or {})
        mb = args.get("micro_batch", args.get("micro"))  # the runtime writes -1 for once-per-step actors
        mb = mb if isinstance(mb, int) and mb >= 0 else None
        kind = event_kind(ev, lane)
        group = args.get("group") or ()
        return Bar(ev.get("pid", 0), stream_of(lane, kind), str(ev.get("name", args.get("op", "?"))), kind,
                   float(start), float(dur), mb, args, _int_or_none(args.get("step")),
                   _int_or_none(args.get("mesh_axis")), tuple(group), actor_kind=str(args.get("kind", "")))

    for i, ev in enumerate(events):
        ph = ev.get("ph", "X")
        if ph not in ("X", "B", "E"):
            continue
        if "ts" not in ev:
            raise InputError(f"trace event {i} ({ev.get('name', '?')!r}, ph={ph!r}) has no 'ts'")
        key = (ev.get("pid"), ev.get("tid"))
        if ph == "X":
            if "dur" not in ev:
                raise InputError(f"complete event {i} ({ev.get('name', '?')!r}) has no 'dur'")
            bars.append(bar(ev, ev["ts"], ev["dur"]))
        elif ph == "B":
            open_.setdefault(key, []).append(ev)
        else:
            if not open_.get(key):
                raise InputError(f"end event {i} on pid={key[0]} tid={key[1]} has no matching begin event")
            begin = open_[key].pop()
            merged = {**begin, "args": {**(begin.get("args") or {}), **(ev.get("args") or {})}}
            bars.append(bar(merged, begin["ts"], ev["ts"] - begin["ts"]))
    pairs = flow_pairs(events, bars, where)
    ahead = ahead_of(events, bars, where, pairs)
    if ahead is not None:
        bars = [dataclasses.replace(b, ahead=a) for b, a in zip(bars, ahead)]
    for consumer, producer in pairs:  # a flow across ranks: the send that fed a receive
        if where[consumer][0] != where[producer][0]:
            p = bars[producer]
            bars[consumer] = dataclasses.replace(bars[consumer], source=(p.rank, p.name, p.args.get("firing")))
    return pack_levels(sorted(bars, key=lambda b: b.start_us))


def pack_levels(bars: Iterable[Bar]) -> list[Bar]:
    """Overlapping firings of one rank's lane get side-by-side slots: ``level`` (first free slot by
    start time) of ``levels`` (the most in flight at once on that lane)."""
    bars = sorted(bars, key=lambda b: b.start_us)
    level: list[int] = []
    ends: dict[tuple[Any, str], list[float]] = {}
    for b in bars:
        slots = ends.setdefault((b.rank, b.lane), [])
        for j, end in enumerate(slots):
            if end <= b.start_us:
                slots[j] = b.end_us
                level.append(j)
                break
        else:
            slots.append(b.end_us)
            level.append(len(slots) - 1)
    return [dataclasses.replace(b, level=k, levels=len(ends[(b.rank, b.lane)])) for b, k in zip(bars, level)]


def select(bars: Sequence[Bar], step: int | None = None, ranks: Iterable[Any] | None = None) -> list[Bar]:
    """The bars of one training step (and some ranks), lanes re-packed.

    A step is what its firings say they belong to, not a window of time: a ZeRO-3 step's parameter
    all-gathers that start while the previous step is still computing (prefetched) are kept, and the
    next step's prefetches are left out. Firings that read nothing the step computed (data sources,
    constants, zero fills, what only they feed: ``Bar.ahead``) and parameter holders (which fire as
    soon as the previous update is done) fire ahead, long before the step's work; where the trace has
    register flows, those that start before the step's first communication or first other firing are
    left out, so the picture starts where the step's work does.
    """
    keep = list(bars)
    if ranks is not None:
        want = set(ranks)
        keep = [b for b in keep if b.rank in want]
        if not keep:
            raise InputError(f"no firings on ranks {sorted(want)}; the trace has ranks "
                             f"{sorted({b.rank for b in bars}, key=str)}")
    if step is not None:
        steps = sorted({b.step for b in keep if b.step is not None})
        if step not in steps:
            raise InputError(f"no firings of step {step}; the trace has steps {steps}" if steps else
                             f"step={step}: the trace's events carry no step numbers (args.step)")
        keep = [b for b in keep if b.step == step]
        if any(b.ahead is not None for b in keep):
            work = [b.start_us for b in keep if b.lane == "comm" or (b.ahead is False and b.actor_kind != "state")]
            if work:
                keep = [b for b in keep if b.start_us >= min(work)]
    return pack_levels(keep)


@dataclass(frozen=True)
class Gap:
    """A stretch of ``rank``'s compute lane with nothing running: a pipeline bubble, a wait for data."""

    rank: Any
    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


def idle_gaps(bars: Sequence[Bar], min_fraction: float = 0.005) -> list[Gap]:
    """Per rank, the gaps of its compute lane within the span of ``bars`` (before its first firing
    and after its last too), ignoring gaps shorter than ``min_fraction`` of the span (the runtime's
    per-firing overhead would otherwise draw a sliver between every two kernels)."""
    if not bars:
        return []
    t0, t1 = min(b.start_us for b in bars), max(b.end_us for b in bars)
    least = max(1e-9, min_fraction * (t1 - t0))
    out: list[Gap] = []
    for rank in dict.fromkeys(b.rank for b in bars):
        busy = sorted((b.start_us, b.end_us) for b in bars if b.rank == rank and b.lane == "compute")
        at = t0
        for s, e in busy + [(t1, t1)]:
            if s - at >= least:
                out.append(Gap(rank, at, s))
            at = max(at, e)
    return out


def span_us(bars: Sequence[Bar]) -> float:
    if not bars:
        return 0.0
    return max(b.end_us for b in bars) - min(b.start_us for b in bars)


def makespan_us(trace: Any) -> float:
    """End of the last firing minus start of the first, in microseconds."""
    return span_us(timeline_bars(trace))
