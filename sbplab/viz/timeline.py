"""A timeline of a run: a row per rank and lane, a bar per actor firing, read from Chrome trace events.

The input is the one trace format of the project (Chrome/Perfetto JSON events: ``pid`` = rank,
``tid`` = lane, ``ts``/``dur`` in microseconds, ``args`` with op, actor, micro_batch, bytes, phase),
so anything Perfetto opens we can draw, and the bars are exactly the trace's complete events.
plotly is imported only when a figure is built.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boxing import kinds as boxing_kinds
from ..fmt import fmt_bytes
from .colors import KIND_COLORS, shade

KINDS = tuple(KIND_COLORS)  # forward, backward, update, communication, other
_LANE_WORDS = ("comm", "collective", "p2p", "boxing", "send", "recv")


def _comm_words() -> tuple[str, ...]:
    """Words that mark communication: lane names, and every boxing kind that talks (registered ones too)."""
    return _LANE_WORDS + tuple(name for name, k in boxing_kinds.KINDS.items() if k.moves_data)


@dataclass(frozen=True)
class Bar:
    """One actor firing, as drawn: a complete (``X``) event or a matched ``B``/``E`` pair."""

    rank: Any  # the event's pid
    lane: str  # thread name if the trace names it, else str(tid)
    name: str
    kind: str  # one of KINDS
    start_us: float
    dur_us: float
    micro_batch: int | None
    args: dict

    @property
    def row(self) -> str:
        return f"rank {self.rank} · {self.lane}"


def trace_events(trace: Any) -> list[dict]:
    """The Chrome events of a runtime Trace (``.to_chrome()``), a Chrome JSON dict or file, an object
    with ``.events`` holding Chrome event dicts, or a plain list of events."""
    if isinstance(trace, (str, Path)):
        trace = json.loads(Path(trace).read_text())
    elif hasattr(trace, "to_chrome"):
        trace = trace.to_chrome()
    if isinstance(trace, dict):
        if "traceEvents" not in trace:
            raise ValueError("a Chrome trace dict needs a 'traceEvents' list")
        trace = trace["traceEvents"]
    elif hasattr(trace, "events"):
        trace = trace.events
    out = []
    for i, ev in enumerate(trace):
        if dataclasses.is_dataclass(ev) and all(hasattr(ev, k) for k in ("rank", "lane", "start", "end")):
            ev = _from_record(ev)  # a runtime TraceEvent, e.g. from trace.select(rank=0)
        if not isinstance(ev, dict):
            raise TypeError(f"trace event {i} is a {type(ev).__name__}, "
                            f"expected a dict of Chrome trace fields")
        out.append(ev)
    return out


def _from_record(e: Any) -> dict:
    args = {k: getattr(e, k) for k in ("op", "kind", "step", "micro", "bytes") if hasattr(e, k)}
    return {"ph": "X", "pid": e.rank, "tid": e.lane, "name": getattr(e, "actor", getattr(e, "op", "?")),
            "cat": getattr(e, "phase", ""), "ts": e.start, "dur": e.end - e.start, "args": args}


def event_kind(ev: dict, lane: str = "") -> str:
    """forward / backward / update / communication / other, from args.kind, cat, lane, op or phase."""
    args = ev.get("args") or {}
    if args.get("kind") in KINDS:
        return args["kind"]
    fields = (ev.get("cat", ""), lane, args.get("kind", ""), args.get("op", ""), ev.get("name", ""))
    words = " ".join(str(x).lower() for x in fields)
    if any(w in words for w in _comm_words()):
        return "communication"
    for v in (args.get("phase"), ev.get("cat")):
        if v in ("forward", "backward", "update"):
            return v
    return "other"


def _lane_names(events: Sequence[dict]) -> dict[tuple[Any, Any], str]:
    return {(e.get("pid"), e.get("tid")): str((e.get("args") or {}).get("name", e.get("tid")))
            for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}


def timeline_bars(trace: Any) -> list[Bar]:
    """Every firing of ``trace`` as a Bar, by start time.

    Metadata, flow, instant and counter events are skipped: they are not firings.
    """
    events = trace_events(trace)
    names = _lane_names(events)
    open_: dict[tuple[Any, Any], list[dict]] = {}
    bars: list[Bar] = []

    def bar(ev: dict, start: float, dur: float) -> Bar:
        lane = names.get((ev.get("pid"), ev.get("tid")), str(ev.get("tid", 0)))
        args = dict(ev.get("args") or {})
        mb = args.get("micro_batch", args.get("micro"))  # the runtime writes -1 for once-per-step actors
        mb = mb if isinstance(mb, int) and mb >= 0 else None
        return Bar(ev.get("pid", 0), lane, str(ev.get("name", args.get("op", "?"))), event_kind(ev, lane),
                   float(start), float(dur), mb, args)

    for i, ev in enumerate(events):
        ph = ev.get("ph", "X")
        if ph not in ("X", "B", "E"):
            continue
        if "ts" not in ev:
            raise ValueError(f"trace event {i} ({ev.get('name', '?')!r}, ph={ph!r}) has no 'ts'")
        key = (ev.get("pid"), ev.get("tid"))
        if ph == "X":
            if "dur" not in ev:
                raise ValueError(f"complete event {i} ({ev.get('name', '?')!r}) has no 'dur'")
            bars.append(bar(ev, ev["ts"], ev["dur"]))
        elif ph == "B":
            open_.setdefault(key, []).append(ev)
        else:
            if not open_.get(key):
                raise ValueError(f"end event {i} on pid={key[0]} tid={key[1]} has no matching begin event")
            begin = open_[key].pop()
            merged = {**begin, "args": {**(begin.get("args") or {}), **(ev.get("args") or {})}}
            bars.append(bar(merged, begin["ts"], ev["ts"] - begin["ts"]))
    return sorted(bars, key=lambda b: b.start_us)


def _rows(bars: Iterable[Bar]) -> list[str]:
    """Rows ordered by rank, then lane (compute before communication), as they first appear."""
    def key(b: Bar):
        # natural order of lane names, so "comm 2" comes before "comm 10"
        lane = tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", b.lane))
        return (str(type(b.rank)), b.rank, "comm" in b.lane.lower(), lane)
    return list(dict.fromkeys(b.row for b in sorted(bars, key=key)))


def _add_bars(fig: Any, bars: list[Bar], t0: float, row: int | None, col: int | None, legend: bool) -> None:
    import plotly.graph_objects as go

    for kind in KINDS:
        sel = [b for b in bars if b.kind == kind]
        if not sel:
            continue
        custom = [[b.args.get("op", b.name), b.args.get("actor", "-"),
                   "-" if b.micro_batch is None else b.micro_batch, b.args.get("sbp", "-"),
                   fmt_bytes(b.args.get("bytes")), b.dur_us, b.start_us - t0, b.args.get("step", "-")]
                  for b in sel]
        trace = go.Bar(
            x=[b.dur_us for b in sel], base=[b.start_us - t0 for b in sel], y=[b.row for b in sel],
            orientation="h", name=kind, legendgroup=kind, showlegend=legend,
            marker=dict(color=[shade(KIND_COLORS[kind], b.micro_batch or 0) for b in sel],
                        line=dict(color="rgba(40,40,40,0.35)", width=0.5)),
            text=[str(b.args.get("op", b.name)).rsplit(":", 1)[-1] for b in sel],  # "module:kernel" -> kernel
            textposition="inside", insidetextanchor="middle", textangle=0,
            customdata=custom,
            hovertemplate=("<b>%{customdata[0]}</b> (%{fullData.name})<br>actor %{customdata[1]}"
                           "<br>step %{customdata[7]}, micro-batch %{customdata[2]}"
                           "<br>SBP %{customdata[3]}<br>bytes %{customdata[4]}"
                           "<br>start %{customdata[6]:.1f} us, duration %{customdata[5]:.1f} us"
                           "<extra></extra>"),
        )
        if row is None:
            fig.add_trace(trace)
        else:
            fig.add_trace(trace, row=row, col=col)


def _start(bars: list[Bar], align_start: bool) -> float:
    return min((b.start_us for b in bars), default=0.0) if align_start else 0.0


def _span(bars: Sequence[Bar]) -> float:
    if not bars:
        return 0.0
    return max(b.start_us + b.dur_us for b in bars) - min(b.start_us for b in bars)


def makespan_us(trace: Any) -> float:
    """End of the last firing minus start of the first, in microseconds."""
    return _span(timeline_bars(trace))


def timeline(trace: Any, title: str | None = None, align_start: bool = True) -> Any:
    """A plotly Figure: rows = rank and lane, bars = firings coloured by kind, shaded by micro-batch."""
    import plotly.graph_objects as go

    bars = timeline_bars(trace)
    fig = go.Figure()
    _add_bars(fig, bars, _start(bars, align_start), None, None, True)
    rows = _rows(bars)
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1])
    fig.update_xaxes(title_text="time (us)", type="linear")
    head = title or "timeline"
    fig.update_layout(
        title=f"{head}: {_span(bars):.0f} us, colour = kind, shade = micro-batch",
        barmode="overlay", height=140 + 34 * max(1, len(rows)), bargap=0.25,
        uniformtext=dict(minsize=8, mode="hide"), legend_title_text="kind",
    )
    return fig


def compare_timelines(a: Any, b: Any, labels: Sequence[str] = ("A", "B"), arrange: str = "stacked",
                      align_start: bool = True) -> Any:
    """Two runs on one time scale: ``stacked`` (one above the other) or ``side`` (left and right)."""
    from plotly.subplots import make_subplots

    if arrange not in ("stacked", "side"):
        raise ValueError(f"arrange must be 'stacked' or 'side', got {arrange!r}")
    if len(labels) != 2:
        raise ValueError(f"compare_timelines needs two labels, got {list(labels)}")
    all_bars = [timeline_bars(a), timeline_bars(b)]
    spans = [_span(x) for x in all_bars]
    titles = [f"{lab}: {s:.0f} us" for lab, s in zip(labels, spans)]
    if arrange == "stacked":
        fig = make_subplots(rows=2, cols=1, subplot_titles=titles, vertical_spacing=0.16)
        where = [(1, 1), (2, 1)]
    else:
        fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.12)
        where = [(1, 1), (1, 2)]
    for i, bars in enumerate(all_bars):
        r, c = where[i]
        _add_bars(fig, bars, _start(bars, align_start), r, c, legend=i == 0)
        fig.update_yaxes(categoryorder="array", categoryarray=_rows(bars)[::-1], row=r, col=c)
        last = arrange == "side" or i == 1
        fig.update_xaxes(title_text="time (us)" if last else None, type="linear", row=r, col=c)
    fig.layout.xaxis2.matches = "x"  # one time scale, so lengths compare directly
    n = max(len(_rows(x)) for x in all_bars)
    ratio = spans[1] / spans[0] if spans[0] else float("nan")
    fig.update_layout(
        title=f"{labels[1]} / {labels[0]} makespan = {ratio:.2f}", barmode="overlay", bargap=0.25,
        height=(2 if arrange == "stacked" else 1) * (90 + 34 * max(1, n)) + 80,
        uniformtext=dict(minsize=8, mode="hide"), legend_title_text="kind",
    )
    return fig

