"""A timeline of a run or a prediction, the way Perfetto shows a trace: two lanes per rank (compute,
communication), a bar per firing, on a millisecond axis that zooms (plotly's box and wheel zoom).

Colours say what ran (a colour-blind-safe palette): compute in shades of blue by phase (forward,
backward, update), each mesh axis's collectives in their own hue (data-parallel and tensor-parallel
groups tell apart), transfers between placements in vermillion, and the compute lane's idle stretches
in grey, so bubbles show. A communication firing is hatched while it waits (for its peers, its send,
or its stream) and solid while it moves data; a dotted line joins a collective's members and an arrow
runs from each send to its receive; dashed lines mark where each step starts; a Prediction's critical
path is outlined; a memory track per rank follows the lanes when the run measured it. Hovering a bar
reads the op and the tensor it moves, the SBPs before and after, bytes, group and duration (tensor,
module and SBPs need the compiled step: ``compiled=``). ``step=`` draws one training step by the step
its firings belong to, so prefetched collectives stay. ``timeline(a, b)`` stacks two traces on one time
scale: a prediction over a measured run, say. The RunPanel shows this same figure, and both follow the
notebook's light or dark theme (``plotly_theme``). plotly is imported only when a figure is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import InputError, InputTypeError
from ..fmt import fmt_bytes
from .colors import device_color
from .plotly_theme import TRANSPARENT, figure_class
from .timeline_bars import (
    KINDS,
    Bar,
    Gap,
    event_kind,
    makespan_us,
    select,
    span_us,
    timeline_bars,
    trace_events,
)
from .timeline_draw import Marks, add_counters, add_firings, fmt_us
from .timeline_layout import Lanes, Series
from .timeline_links import counters, critical_keys, on_critical_path
from .trace_info import ActorInfo, ActorLookup

__all__ = ["KINDS", "Bar", "Gap", "compare_timelines", "event_kind", "fmt_us", "makespan_us", "timeline",
           "timeline_bars", "trace_events"]

PX_PER_LANE = 30  # figure pixels per compute-lane height
MEMORY_ROW = 0.3  # the memory track's height against the lanes
MEMORY_MIN = 3.0  # and at least this many lanes' height, so its axis reads


def _prepare(trace: Any, step: int | None, ranks: Iterable[Any] | None) -> list[Bar]:
    bars = timeline_bars(trace)
    return select(bars, step, ranks) if step is not None or ranks is not None else bars


def _lookup(compiled: Any) -> tuple[Callable[[Any, str], ActorInfo], dict[int, str]]:
    if compiled is None:
        return (lambda rank, actor: ActorInfo()), {}
    lk = ActorLookup(compiled)
    return lk, lk.axis_names()


def _label_of(x: Any, default: str) -> str:
    """"predicted" for a simulator's Prediction, "measured" for a run's result, else ``default``."""
    if hasattr(x, "hardware") and hasattr(x, "step_time"):
        return f"predicted on {x.hardware.name}"
    if hasattr(x, "losses") and hasattr(x, "trace"):
        return "measured"
    return default


def _layout(fig: Any, lanes: float, title: str) -> None:
    fig.update_layout(
        title=title, barmode="overlay", height=170 + PX_PER_LANE * max(1.0, lanes),
        uniformtext=dict(minsize=9, mode="hide"), legend_title_text="what ran",
        legend=dict(yanchor="top", y=1.0, xanchor="left", x=1.01, traceorder="normal"),
        hoverlabel=dict(align="left"), margin=dict(t=70, l=130), plot_bgcolor=TRANSPARENT,
        paper_bgcolor=TRANSPARENT,  # the page's own background, light or dark (plotly_theme)
    )
    fig.update_xaxes(showgrid=True, gridcolor="rgba(128,128,128,0.25)", zeroline=False)
    fig.update_yaxes(gridcolor="rgba(128,128,128,0.25)")


def timeline(trace: Any, other: Any = None, *, title: str | None = None, step: int | None = None,
             ranks: Iterable[Any] | None = None, compiled: Any = None, labels: Sequence[str] | None = None,
             align_start: bool = True, arrange: str = "stacked", memory: Any = None) -> Any:
    """A plotly Figure of ``trace`` (a Trace, a RunResult, a Prediction, Chrome JSON or events).

    other: a second trace: both are drawn on one time scale (see ``compare_timelines``).
    step: draw only this training step (its firings by their step number; prefetches stay).
    ranks: draw only these ranks.
    compiled: the compiled step the trace ran (``sl.compile``): hover names the tensor a collective
        moves, module paths and SBPs before and after, the legend names mesh axes (``dp``, ``tp``).
    memory: per rank, ``[(time_us, bytes), ...]`` to draw as a memory track below the lanes; by default
        a RunResult's measured bytes held over time (``result.memory``'s samples, on the trace's clock) or
        the trace's Chrome counter events, if any.
        A run's measured peak per rank (``RunResult.memory``; a Prediction's simulated one) is written
        beside each rank's compute lane.
    A Prediction's critical path is outlined; a communication firing's waiting stretch is hatched.
    """
    if isinstance(other, str):
        raise InputTypeError(f"timeline's second argument is a second trace to compare with; pass the title "
                             f"as title={other!r}")
    if other is not None:
        return compare_timelines(trace, other, labels=labels, arrange=arrange, align_start=align_start,
                                 step=step, ranks=ranks, compiled=compiled, title=title)
    from plotly.subplots import make_subplots

    bars = _prepare(trace, step, ranks)
    lookup, axis_names = _lookup(compiled)
    t0 = min((b.start_us for b in bars), default=0.0) if align_start else 0.0
    tracks = _memory_tracks(trace, memory, bars)
    lane_h = max(1.0, Lanes.of(bars).total)
    if tracks:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                            row_heights=[lane_h, max(MEMORY_MIN, lane_h * MEMORY_ROW)], figure=figure_class()())
        marks = Marks((1, 1), set())
    else:
        fig, marks = figure_class()(), Marks(None, set())
    lanes = add_firings(fig, bars, t0, marks, lookup, Series(axis_names),
                        on_critical_path(bars, critical_keys(trace)))
    axis = {"row": 1, "col": 1} if tracks else {}
    ticks = lanes.axis()
    peaks = _peaks(trace)
    if peaks:  # a run's measured (a prediction's simulated) peak memory, beside each rank's compute lane
        ticks["ticktext"] = [f"{t} (peak {fmt_bytes(peaks[int(t.split()[1])])})"
                             if t.endswith("· compute") and t.split()[1].isdigit() and int(t.split()[1]) in peaks
                             else t for t in ticks["ticktext"]]
    fig.update_yaxes(**ticks, **axis)
    if tracks:
        add_counters(fig, tracks, t0, Marks((2, 1), marks.shown), _rank_color)
        fig.update_yaxes(title_text="memory (bytes)", rangemode="tozero", row=2, col=1)
        fig.update_xaxes(title_text="time (ms)", type="linear", rangemode="tozero", row=2, col=1)
    else:
        fig.update_xaxes(title_text="time (ms)", type="linear", rangemode="tozero")
    head = title or _label_of(trace, "timeline")
    if step is not None:
        head += f", step {step}"
    _layout(fig, lanes.total + (max(MEMORY_MIN, lane_h * MEMORY_ROW) if tracks else 0), f"{head}: {fmt_us(span_us(bars))}")
    return fig


def _peaks(x: Any) -> dict[int, int]:
    """Per rank, the peak memory a RunResult measured (``memory``) or a Prediction simulated."""
    measured = getattr(x, "memory", None)
    if isinstance(measured, dict) and measured and all(hasattr(m, "peak") for m in measured.values()):
        return {int(r): int(m.peak) for r, m in measured.items()}
    simulated = getattr(x, "peak_memory", None) if hasattr(x, "step_time") else None
    return {int(r): int(v) for r, v in simulated.items()} if isinstance(simulated, dict) else {}


def _rank_color(rank: Any) -> str:
    return device_color(rank) if isinstance(rank, int) and rank >= 0 else "#666666"


MAX_POINTS = 800  # a memory track's points per rank (a plot's width in pixels): beyond, each bucket's peak


def measured_memory(x: Any) -> dict[int, list[tuple[float, int]]] | None:
    """A RunResult's bytes held per rank over time, on its trace's clock (None for anything else)."""
    memory, trace = getattr(x, "memory", None), getattr(x, "trace", None)
    if not isinstance(memory, dict) or not hasattr(trace, "memory_series"):
        return None
    return trace.memory_series(memory) or None


def _thin(ts: Sequence[float], vs: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """At most ``MAX_POINTS`` points: per time bucket its largest value (a peak never disappears)."""
    if len(ts) <= MAX_POINTS:
        return tuple(ts), tuple(vs)
    lo, width = ts[0], (ts[-1] - ts[0]) / MAX_POINTS or 1.0
    best: dict[int, tuple[float, float]] = {}
    for t, v in zip(ts, vs):
        k = min(int((t - lo) / width), MAX_POINTS - 1)
        if k not in best or v > best[k][1]:
            best[k] = (t, v)
    keep = [best[k] for k in sorted(best)]
    return tuple(t for t, _ in keep), tuple(v for _, v in keep)


def _memory_tracks(trace: Any, memory: Any, bars: Sequence[Bar]) -> list:
    """The memory counters to draw, on the drawn ranks and within the drawn span."""
    if memory is None:
        memory = measured_memory(trace)
    found = counters([] if memory is not None else trace_events(trace), memory)
    if not bars:
        return found
    ranks = {b.rank for b in bars}
    lo, hi = min(b.start_us for b in bars), max(b.end_us for b in bars)
    out = []
    for c in found:
        keep = [(t, v) for t, v in zip(c.t_us, c.values) if lo <= t <= hi]
        if c.rank in ranks and keep:
            out.append(type(c)(c.rank, c.name, *_thin([t for t, _ in keep], [v for _, v in keep])))
    return out


def compare_timelines(a: Any, b: Any, labels: Sequence[str] | None = None, arrange: str = "stacked",
                      align_start: bool = True, *, step: int | None = None, ranks: Iterable[Any] | None = None,
                      compiled: Any = None, title: str | None = None) -> Any:
    """Two traces on one time scale: ``stacked`` (one above the other) or ``side`` (left and right).

    A prediction and a measured run of one step line up actor by actor: ``compare_timelines(pred,
    result)`` labels them "predicted" and "measured" by themselves.
    """
    from plotly.subplots import make_subplots

    if arrange not in ("stacked", "side"):
        raise InputError(f"arrange must be 'stacked' or 'side', got {arrange!r}")
    labels = tuple(labels) if labels is not None else (_label_of(a, "A"), _label_of(b, "B"))
    if len(labels) != 2:
        raise InputError(f"compare_timelines needs two labels, got {list(labels)}")
    all_bars = [_prepare(a, step, ranks), _prepare(b, step, ranks)]
    spans = [span_us(x) for x in all_bars]
    titles = [f"{lab}: {fmt_us(s)}" for lab, s in zip(labels, spans)]
    heights = [max(1.0, Lanes.of(x).total) for x in all_bars]
    if arrange == "stacked":
        fig = make_subplots(rows=2, cols=1, subplot_titles=titles, vertical_spacing=0.14, row_heights=heights,
                            figure=figure_class()())
        where = [(1, 1), (2, 1)]
    else:
        fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.14, figure=figure_class()())
        where = [(1, 1), (1, 2)]
    lookup, axis_names = _lookup(compiled)
    series, shown = Series(axis_names), set()
    for i, bars in enumerate(all_bars):
        r, c = where[i]
        t0 = min((x.start_us for x in bars), default=0.0) if align_start else 0.0
        lanes = add_firings(fig, bars, t0, Marks((r, c), shown), lookup, series,
                            on_critical_path(bars, critical_keys((a, b)[i])))
        fig.update_yaxes(**lanes.axis(), row=r, col=c)
        last = arrange == "side" or i == 1
        fig.update_xaxes(title_text="time (ms)" if last else None, type="linear", rangemode="tozero", row=r, col=c)
    fig.layout.xaxis2.matches = "x"  # one time scale, so lengths compare directly
    ratio = spans[1] / spans[0] if spans[0] else float("nan")
    head = title or f"{labels[1]} / {labels[0]}"
    total = sum(heights) + 2 if arrange == "stacked" else max(heights)
    _layout(fig, total, f"{head}: makespan ratio {ratio:.2f}")
    return fig
