"""A timeline of a run or a prediction: two lanes per rank (compute, communication), a bar per firing.

Colours say what ran: compute in shades of blue by phase (forward, backward, update), each mesh
axis's collectives in their own hue (data-parallel and tensor-parallel groups tell apart), transfers
between placements in red, and the compute lane's idle stretches in grey, so bubbles show. Hovering
a bar reads its actor, op, module path, SBPs in and out, group, bytes and duration (module and SBPs
need the compiled step: ``compiled=``). Time runs in milliseconds from the first drawn firing.
``step=`` draws one training step by the step its firings belong to, so prefetched collectives stay.
``timeline(a, b)`` stacks two traces on one time scale: a prediction over a measured run, say.
plotly is imported only when a figure is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import InputError, InputTypeError
from ..fmt import fmt_bytes
from .colors import KIND_COLORS
from .timeline_bars import (
    KINDS,
    Bar,
    Gap,
    event_kind,
    idle_gaps,
    makespan_us,
    select,
    span_us,
    timeline_bars,
    trace_events,
)
from .timeline_layout import BAND, Lanes, Series
from .trace_info import ActorInfo, ActorLookup

__all__ = ["KINDS", "Bar", "compare_timelines", "event_kind", "makespan_us", "timeline", "timeline_bars",
           "trace_events"]

PX_PER_LANE = 30  # figure pixels per compute-lane height


def fmt_us(us: float) -> str:
    """``850 µs``, ``12.3 ms``, ``1.25 s``: durations as people read them."""
    if abs(us) < 1e3:
        return f"{us:.1f} µs"
    if abs(us) < 1e6:
        return f"{us / 1e3:.3g} ms" if abs(us) < 1e5 else f"{us / 1e3:.0f} ms"
    return f"{us / 1e6:.3g} s"


def _short(op: object) -> str:
    """``sbplab.boxing.kinds.local_kinds:to_partial`` -> ``to_partial``: a kernel by its function's name."""
    return str(op).rsplit(":", 1)[-1]


def _hover(b: Bar, t0: float, info: ActorInfo, series: str) -> str:
    op = _short(b.args.get("op", b.name))
    lines = [f"<b>{op}</b> · {series}", f"rank {b.rank}, actor {b.name}"]
    if info.module or b.args.get("module"):
        lines.append(f"module {info.module or b.args.get('module')}")
    if info.tensor:
        lines.append(f"tensor {info.tensor}")
    sbp = info.sbp or b.args.get("sbp")
    if sbp:
        lines.append(f"SBP {sbp}")
    if b.group:
        where = "" if b.mesh_axis is None else f" on mesh axis {b.mesh_axis}" + (
            f" ({info.axis_name})" if info.axis_name else "")
        what = "from rank {} to rank {}".format(*b.group) if b.kind == "p2p" and len(b.group) == 2 else \
            f"group ({', '.join(map(str, b.group))})"
        lines.append(what + where)
    when = [f"step {b.step}"] if b.step is not None else []
    if b.micro_batch is not None:
        when.append(f"micro-batch {b.micro_batch}")
    if when:
        lines.append(", ".join(when))
    if isinstance(b.args.get("bytes"), (int, float)) and (b.args["bytes"] or b.lane == "comm"):
        lines.append(f"bytes sent {fmt_bytes(b.args['bytes'])}")
    lines.append(f"start {(b.start_us - t0) / 1e3:.3f} ms, duration {fmt_us(b.dur_us)}")
    return "<br>".join(lines)


def _add(fig: Any, bars: Sequence[Bar], t0: float, where: tuple[int, int] | None, lookup: Callable,
         series: Series, shown: set[str]) -> Lanes:
    """Every bar of ``bars`` and the compute lanes' idle gaps, one plotly trace per legend entry."""
    import plotly.graph_objects as go

    lanes = Lanes.of(bars)
    micro = len({b.micro_batch for b in bars if b.micro_batch is not None}) > 1
    gaps = idle_gaps(bars)
    if gaps:  # first, so firings draw over it
        _add_idle(fig, gaps, t0, where, lanes, "idle" not in shown)
        shown.add("idle")
    groups: dict[tuple, list[Bar]] = {}
    for b in bars:
        groups.setdefault(series.key(b), []).append(b)
    for key in sorted(groups):
        sel = groups[key]
        name = series.name(key, sel[0])
        geo = [lanes.y(b) for b in sel]
        text = [_short(b.args.get("op", b.name)) + (f" {b.micro_batch}" if micro and b.micro_batch is not None
                                                    else "") for b in sel]
        tr = go.Bar(
            y=[g[0] for g in geo], width=[g[1] for g in geo], x=[b.dur_us / 1e3 for b in sel],
            base=[(b.start_us - t0) / 1e3 for b in sel], orientation="h", name=name,
            legendgroup=name, showlegend=name not in shown, legendrank=1000 + 10 * key[0] + min(key[1], 9),
            marker=dict(color=series.color(sel[0]), line=dict(color="rgba(255,255,255,0.7)", width=0.5)),
            text=text, textposition="inside", insidetextanchor="middle", textangle=0,
            hovertext=[_hover(b, t0, lookup(b.rank, b.name), name) for b in sel], hoverinfo="text",
            customdata=[[b.row, b.name, b.step] for b in sel],  # what each bar is, for click handlers and tests
        )
        shown.add(name)
        _put(fig, tr, where)
    for y in lanes.rank_tops:
        fig.add_hline(y=y, line=dict(color="rgba(120,120,120,0.5)", width=1),
                      **({"row": where[0], "col": where[1]} if where else {}))
    return lanes


def _add_idle(fig: Any, gaps: Sequence[Gap], t0: float, where: tuple[int, int] | None, lanes: Lanes,
              legend: bool) -> None:
    import plotly.graph_objects as go

    rows = [f"rank {g.rank} · compute" for g in gaps]
    tr = go.Bar(
        y=[lanes.top[r] + lanes.height[r] / 2 for r in rows], width=[BAND * 0.45] * len(gaps),
        x=[g.dur_us / 1e3 for g in gaps], base=[(g.start_us - t0) / 1e3 for g in gaps], orientation="h",
        name="idle", legendgroup="idle", showlegend=legend, legendrank=2000,
        marker=dict(color=KIND_COLORS["idle"], line=dict(width=0)),
        hovertext=[f"rank {g.rank} idle for {fmt_us(g.dur_us)}<br>from {(g.start_us - t0) / 1e3:.3f} ms "
                   f"to {(g.end_us - t0) / 1e3:.3f} ms" for g in gaps], hoverinfo="text",
    )
    _put(fig, tr, where)


def _put(fig: Any, trace: Any, where: tuple[int, int] | None) -> None:
    if where is None:
        fig.add_trace(trace)
    else:
        fig.add_trace(trace, row=where[0], col=where[1])


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
        hoverlabel=dict(align="left"), margin=dict(t=70, l=130), plot_bgcolor="white",
    )
    fig.update_xaxes(showgrid=True, gridcolor="rgba(0,0,0,0.08)", zeroline=False)


def timeline(trace: Any, other: Any = None, *, title: str | None = None, step: int | None = None,
             ranks: Iterable[Any] | None = None, compiled: Any = None, labels: Sequence[str] | None = None,
             align_start: bool = True, arrange: str = "stacked") -> Any:
    """A plotly Figure of ``trace`` (a Trace, a RunResult, a Prediction, Chrome JSON or events).

    other: a second trace: both are drawn on one time scale (see ``compare_timelines``).
    step: draw only this training step (its firings by their step number; prefetches stay).
    ranks: draw only these ranks.
    compiled: the compiled step the trace ran (``sl.compile``): hover shows module paths and SBPs,
        the legend names mesh axes (``dp``, ``tp``).
    """
    if isinstance(other, str):
        raise InputTypeError(f"timeline's second argument is a second trace to compare with; pass the title "
                             f"as title={other!r}")
    if other is not None:
        return compare_timelines(trace, other, labels=labels, arrange=arrange, align_start=align_start,
                                 step=step, ranks=ranks, compiled=compiled, title=title)
    import plotly.graph_objects as go

    bars = _prepare(trace, step, ranks)
    lookup, axis_names = _lookup(compiled)
    t0 = min((b.start_us for b in bars), default=0.0) if align_start else 0.0
    fig = go.Figure()
    lanes = _add(fig, bars, t0, None, lookup, Series(axis_names), set())
    fig.update_yaxes(**lanes.axis())
    fig.update_xaxes(title_text="time (ms)", type="linear", rangemode="tozero")
    head = title or _label_of(trace, "timeline")
    if step is not None:
        head += f", step {step}"
    _layout(fig, lanes.total, f"{head}: {fmt_us(span_us(bars))}")
    return fig


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
        fig = make_subplots(rows=2, cols=1, subplot_titles=titles, vertical_spacing=0.14, row_heights=heights)
        where = [(1, 1), (2, 1)]
    else:
        fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.14)
        where = [(1, 1), (1, 2)]
    lookup, axis_names = _lookup(compiled)
    series, shown = Series(axis_names), set()
    for i, bars in enumerate(all_bars):
        r, c = where[i]
        t0 = min((x.start_us for x in bars), default=0.0) if align_start else 0.0
        lanes = _add(fig, bars, t0, (r, c), lookup, series, shown)
        fig.update_yaxes(**lanes.axis(), row=r, col=c)
        last = arrange == "side" or i == 1
        fig.update_xaxes(title_text="time (ms)" if last else None, type="linear", rangemode="tozero", row=r, col=c)
    fig.layout.xaxis2.matches = "x"  # one time scale, so lengths compare directly
    ratio = spans[1] / spans[0] if spans[0] else float("nan")
    head = title or f"{labels[1]} / {labels[0]}"
    total = sum(heights) + 2 if arrange == "stacked" else max(heights)
    _layout(fig, total, f"{head}: makespan ratio {ratio:.2f}")
    return fig
