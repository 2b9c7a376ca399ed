"""Drawing one trace's marks into a plotly figure: the firings, waiting apart from transferring, idle
gaps, the arrows joining a collective's members and a send to its receive, step markers, the
critical path, and memory counters; the hover text of each firing.

Everything a Perfetto user looks for in a parallel run, in the one timeline ``sl.timeline``,
``compare_timelines`` and the RunPanel show. ``timeline.py`` builds the figure; this module puts
marks in it. plotly is imported by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..fmt import fmt_bytes
from .colors import KIND_COLORS
from .timeline_bars import Bar, Gap, idle_gaps
from .timeline_layout import BAND, Lanes, Series
from .timeline_links import collective_instances, p2p_pairs, step_starts, transfer_starts
from .trace_info import ActorInfo

WAIT_OPACITY = 0.4  # a firing's waiting stretch: its colour, see-through and hatched
FLOW_COLOR = "rgba(90,90,90,0.75)"


def fmt_us(us: float) -> str:
    """``850 µs``, ``12.3 ms``, ``1.25 s``: durations as people read them (a rounding residue is 0)."""
    if abs(us) < 5e-4:
        return "0 µs"
    if abs(us) < 1e3:
        return f"{us:.1f} µs"
    if abs(us) < 1e6:
        return f"{us / 1e3:.3g} ms" if abs(us) < 1e5 else f"{us / 1e3:.0f} ms"
    return f"{us / 1e6:.3g} s"


def ms(us: float) -> float:
    """Microseconds as the figure's milliseconds, to 10 ns: a saved figure keeps 6 digits, not 17."""
    return round(us / 1e3, 5)


def packed(values: Sequence[float], dtype: str = "float64") -> Any:
    """A per-bar number list as a numpy array, which plotly saves as one base64 string (``bdata``)
    where a list is written one number per line in a saved notebook."""
    import numpy as np

    return np.asarray(values, dtype=dtype)


def _each(values: list) -> Any:
    """A per-bar list, or its one value when every bar has it (a saved figure keeps one line, not one each)."""
    return values[0] if values and all(v == values[0] for v in values) else values


def short(op: object) -> str:
    """``sbplab.boxing.kinds.local_kinds:to_partial`` -> ``to_partial``: a kernel by its function's name."""
    return str(op).rsplit(":", 1)[-1]


def hover(b: Bar, t0: float, info: ActorInfo, series: str, ready_us: float) -> str:
    """What a person hovering a firing reads: the op and the tensor it moves first, then its SBP before
    and after, the bytes, the group, how long it waited and moved data, where and when."""
    op = short(b.args.get("op", b.name))
    lines = [f"<b>{op}</b>" + (f" of {info.tensor}" if info.tensor else "") + f" · {series}"]
    module = info.module or b.args.get("module")
    if module:
        lines.append(f"module {module}")
    sbp = info.sbp or b.args.get("sbp")
    if sbp:
        lines.append(f"SBP {sbp}" + (" (before -> after)" if info.tensor else ""))
    if isinstance(b.args.get("bytes"), (int, float)) and (b.args["bytes"] or b.lane == "comm"):
        lines.append(f"bytes sent {fmt_bytes(b.args['bytes'])}")
    if b.group:
        where = "" if b.mesh_axis is None else f" on mesh axis {b.mesh_axis}" + (
            f" ({info.axis_name})" if info.axis_name else "")
        what = "from rank {} to rank {}".format(*b.group) if b.kind == "p2p" and len(b.group) == 2 else \
            f"group ({', '.join(map(str, b.group))})"
        lines.append(what + where)
    if b.lane == "comm" and ready_us > b.start_us:
        lines.append(f"waited {fmt_us(ready_us - b.start_us)} (hatched), moved data {fmt_us(b.end_us - ready_us)}")
    when = [f"rank {b.rank}"] + ([f"step {b.step}"] if b.step is not None else [])
    if b.micro_batch is not None:
        when.append(f"micro-batch {b.micro_batch}")
    lines.append(", ".join(when) + f" · actor {b.name}")
    lines.append(f"start {(b.start_us - t0) / 1e3:.3f} ms, duration {fmt_us(b.dur_us)}")
    return "<br>".join(lines)


@dataclass
class Marks:
    """Where a figure's marks go: the subplot (row, col) or None, the legend entries already shown."""

    where: tuple[int, int] | None
    shown: set[str]

    def put(self, fig: Any, trace: Any) -> None:
        if self.where is None:
            fig.add_trace(trace)
        else:
            fig.add_trace(trace, row=self.where[0], col=self.where[1])

    def legend(self, name: str) -> bool:
        """Show ``name`` in the legend the first time only."""
        first = name not in self.shown
        self.shown.add(name)
        return first


def add_firings(fig: Any, bars: Sequence[Bar], t0: float, marks: Marks, lookup: Callable, series: Series,
                critical: Sequence[int] = ()) -> Lanes:
    """Every bar of ``bars`` (one plotly trace per legend entry, ``meta="firings"``), the compute lanes'
    idle gaps, waiting stretches hatched, the links between firings, step markers and the critical
    path."""
    import plotly.graph_objects as go

    lanes = Lanes.of(bars)
    micro = len({b.micro_batch for b in bars if b.micro_batch is not None}) > 1
    gaps = idle_gaps(bars)
    if gaps:  # first, so firings draw over it
        _add_idle(fig, gaps, t0, marks, lanes)
    ready = transfer_starts(bars)
    waits = [b.lane == "comm" and r - b.start_us > 1e-3 for b, r in zip(bars, ready)]
    groups: dict[tuple, list[int]] = {}
    for i, b in enumerate(bars):
        groups.setdefault(series.key(b), []).append(i)
    for key in sorted(groups):
        ix = groups[key]
        sel = [bars[i] for i in ix]
        name = series.name(key, sel[0])
        color = series.color(sel[0])
        geo = [lanes.y(b) for b in sel]
        text = [short(b.args.get("op", b.name)) + (f" {b.micro_batch}" if micro and b.micro_batch is not None
                                                   else "") for b in sel]
        tips = [hover(b, t0, lookup(b.rank, b.name), name, ready[i]) for i, b in zip(ix, sel)]
        marks.put(fig, go.Bar(
            y=packed([g[0] for g in geo]), width=packed([g[1] for g in geo]), x=packed([ms(b.dur_us) for b in sel]),
            base=[ms(b.start_us - t0) for b in sel], orientation="h", name=name, meta="firings",
            legendgroup=name, showlegend=marks.legend(name), legendrank=1000 + 10 * key[0] + min(key[1], 9),
            marker=dict(color=color, opacity=_each([WAIT_OPACITY if waits[i] else 1.0 for i in ix]),
                        pattern=dict(shape=_each(["/" if waits[i] else "" for i in ix]), fgcolor=color, size=6),
                        line=dict(color="rgba(255,255,255,0.7)", width=0.5)),
            text=text, textposition="inside", insidetextanchor="middle", textangle=0,
            hovertext=tips, hoverinfo="text",
        ))
        moving = [k for k, i in enumerate(ix) if waits[i]]
        if moving:  # the stretch that moved data, solid over the hatched whole
            marks.put(fig, go.Bar(
                y=packed([geo[k][0] for k in moving]), width=packed([geo[k][1] for k in moving]),
                x=packed([ms(sel[k].end_us - ready[ix[k]]) for k in moving]),
                base=[ms(ready[ix[k]] - t0) for k in moving], orientation="h", name=name, meta="transfers",
                legendgroup=name, showlegend=False, marker=dict(color=color, line=dict(width=0)),
                hovertext=[tips[k] for k in moving], hoverinfo="text"))
    if any(waits):
        _legend_only(fig, marks, "waiting (hatched): posted, peers not ready", go.Bar(
            x=[None], y=[None], orientation="h", marker=dict(color="rgba(128,128,128,0.4)",
                                                             pattern=dict(shape="/", fgcolor="#666"))))
    _add_links(fig, bars, ready, t0, lanes, marks)
    if critical:
        _add_critical(fig, [bars[i] for i in critical], t0, lanes, marks)
    for y in lanes.rank_tops:
        fig.add_hline(y=y, line=dict(color="rgba(120,120,120,0.5)", width=1),
                      **({"row": marks.where[0], "col": marks.where[1]} if marks.where else {}))
    add_step_markers(fig, bars, t0, marks, lanes)
    return lanes


def _legend_only(fig: Any, marks: Marks, name: str, trace: Any) -> None:
    if marks.legend(name):
        trace.update(name=name, showlegend=True, hoverinfo="skip", legendrank=3000)
        marks.put(fig, trace)


def _add_idle(fig: Any, gaps: Sequence[Gap], t0: float, marks: Marks, lanes: Lanes) -> None:
    import plotly.graph_objects as go

    rows = [f"rank {g.rank} · compute" for g in gaps]
    marks.put(fig, go.Bar(
        y=packed([lanes.top[r] + lanes.height[r] / 2 for r in rows]), width=BAND * 0.45,
        x=packed([ms(g.dur_us) for g in gaps]), base=[ms(g.start_us - t0) for g in gaps], orientation="h",
        name="idle", legendgroup="idle", showlegend=marks.legend("idle"), legendrank=2000, meta="idle",
        marker=dict(color=KIND_COLORS["idle"], line=dict(width=0)),
        hovertext=[f"rank {g.rank} idle for {fmt_us(g.dur_us)}<br>from {(g.start_us - t0) / 1e3:.3f} ms "
                   f"to {(g.end_us - t0) / 1e3:.3f} ms" for g in gaps], hoverinfo="text",
    ))


def _add_links(fig: Any, bars: Sequence[Bar], ready: Sequence[float], t0: float, lanes: Lanes,
               marks: Marks) -> None:
    """A collective's members joined by one vertical line at the moment data starts to move (every
    member has posted), and an arrow from each send to the receive it feeds (Perfetto's flow arrows)."""
    import plotly.graph_objects as go

    xs: list[float | None] = []
    ys: list[float | None] = []
    for ix in collective_instances(bars):
        at = (max(ready[i] for i in ix) - t0) / 1e3
        for i in ix:
            xs.append(at)
            ys.append(lanes.y(bars[i])[0])
        xs.append(None)
        ys.append(None)
    if xs:
        name = "collective members"
        marks.put(fig, go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, legendgroup=name, meta="links",
                                  showlegend=marks.legend(name), legendrank=2500, hoverinfo="skip",
                                  line=dict(color=FLOW_COLOR, width=1, dash="dot"), marker=dict(size=4)))
    xs, ys, symbols = [], [], []
    for s, r in p2p_pairs(bars):
        xs += [ms(bars[s].start_us - t0), ms(bars[r].end_us - t0), None]
        ys += [lanes.y(bars[s])[0], lanes.y(bars[r])[0], None]
        symbols += ["circle", "arrow", "circle"]
    if xs:
        name = "send → recv"
        marks.put(fig, go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, legendgroup=name, meta="links",
                                  showlegend=marks.legend(name), legendrank=2500, hoverinfo="skip",
                                  line=dict(color=FLOW_COLOR, width=1.2),
                                  marker=dict(symbol=symbols, size=[5, 11, 0] * (len(xs) // 3),
                                              angleref="previous", color=FLOW_COLOR)))


def _add_critical(fig: Any, path: Sequence[Bar], t0: float, lanes: Lanes, marks: Marks) -> None:
    """The simulator's critical path: its firings outlined in black, so what decides the step's end shows."""
    import plotly.graph_objects as go

    name = "critical path"
    geo = [lanes.y(b) for b in path]
    marks.put(fig, go.Bar(
        y=packed([g[0] for g in geo]), width=packed([g[1] for g in geo]), x=packed([ms(b.dur_us) for b in path]),
        base=[ms(b.start_us - t0) for b in path], orientation="h", name=name, legendgroup=name, meta="critical",
        showlegend=marks.legend(name), legendrank=2600, hoverinfo="skip",
        marker=dict(color="rgba(0,0,0,0)", line=dict(color="#000000", width=2))))


def add_step_markers(fig: Any, bars: Sequence[Bar], t0: float, marks: Marks, lanes: Lanes) -> None:
    """A dashed line where each drawn step's work starts, labelled ``step n`` (Perfetto's step slices).

    The labels sit in the band ``lanes`` keeps above the top lane, right of their line: drawn over the
    lanes they hid rank 0's first bars; in the top margin they would meet a subplot's title.
    """
    where = {"row": marks.where[0], "col": marks.where[1]} if marks.where else {}
    for k, (step, at) in enumerate(step_starts(bars).items()):
        x = (at - t0) / 1e3
        fig.add_vline(x=x, line=dict(color="rgba(100,100,100,0.6)", width=1, dash="dash"), **where)
        fig.add_annotation(x=x, y=lanes.label_y(k), text=f"step {step}", font=dict(size=10), showarrow=False,
                           xanchor="left", xshift=2, yanchor="middle", **where)  # close steps alternate heights


def add_counters(fig: Any, counters: Sequence[Any], t0: float, marks: Marks, color: Callable[[Any], str]) -> None:
    """Each rank's memory counter as a step line (bytes held over time), in its rank's colour."""
    import plotly.graph_objects as go

    for c in counters:
        name = f"{c.name}, rank {c.rank}"
        marks.put(fig, go.Scatter(
            x=packed([ms(t - t0) for t in c.t_us]), y=packed([int(v) for v in c.values], "int64"), mode="lines",
            line=dict(shape="hv", width=1.5, color=color(c.rank)),
            name=name, legendgroup=name, showlegend=marks.legend(name), legendrank=4000, meta="counters",
            customdata=[fmt_bytes(int(v)) for v in c.values],  # the hover's words: a few characters a point
            hovertemplate=f"rank {c.rank} {c.name}: %{{customdata}} at %{{x:.3f}} ms<extra></extra>"))
