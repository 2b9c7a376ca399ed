"""Small SVG charts for the widgets: stacked bars per rank, and a timeline of firings.

The notebook pictures of ``sbplab.viz`` are plotly figures; a widget instead gets plain SVG text
from Python (no charting library in the page, nothing to download), built from the same numbers:
``memory_parts`` and ``comm_by_rank`` for the bars, ``timeline_bars`` for the timeline. Every
mark carries a ``<title>`` so hovering shows the exact figure.

Text, axes and grid lines are drawn in ``currentColor`` (lighter ones through opacity), so the chart
takes the text colour of the page around it: JupyterLab's ``--jp-ui-font-color1`` in a widget, light
or dark theme alike, and black on its own. Only the data marks carry fixed hues, which read on both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from ..viz.charts import MEMORY_PARTS, comm_by_rank, memory_parts
from ..viz.colors import category_color, firing_color, shade
from ..viz.graph_dot import fmt_bytes
from ..viz.timeline import Bar

FONT = 'font-family="Helvetica, Arial, sans-serif"'
INK = 'fill="currentColor"'  # on the <svg>: every text inherits the surrounding text colour
MUTED = 'fill="currentColor" fill-opacity="0.7"'  # secondary text (axis figures)
AXIS = 'stroke="currentColor" stroke-opacity="0.5"'
GRID = 'stroke="currentColor" stroke-opacity="0.15"'
MAX_TIMELINE_BARS = 4000  # beyond this the SVG gets heavy in a page; the plotly timeline has them all


def stacked_bars_svg(categories: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]], title: str,
                     fmt: Callable[[float], str] = fmt_bytes, width: int = 460, height: int = 220) -> str:
    """Vertical stacked bars: one bar per category, one segment per non-zero series value."""
    left, top, bottom, legend_w = 56, 26, 26, 150
    plot_w, plot_h = width - left - legend_w, height - top - bottom
    totals = [sum(s[2][i] for s in series) for i in range(len(categories))]
    peak = max(totals, default=0) or 1
    slot = plot_w / max(1, len(categories))
    bw = min(48.0, slot * 0.7)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" {FONT} {INK} font-size="11">',
           f'<text x="{left}" y="15" font-size="12" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" {AXIS}/>',
           f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" {MUTED}>{escape(fmt(peak))}</text>',
           f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" {MUTED}>0</text>']
    for i, cat in enumerate(categories):
        x = left + slot * i + (slot - bw) / 2
        y = top + plot_h
        for name, color, values in series:
            v = values[i]
            if v <= 0:
                continue
            h = v / peak * plot_h
            y -= h
            out.append(f'<rect class="seg" data-series="{escape(name)}" data-value="{v}" x="{x:.1f}" y="{y:.1f}" '
                       f'width="{bw:.1f}" height="{h:.1f}" fill="{color}"><title>{escape(cat)}: {escape(name)} '
                       f'{escape(fmt(v))}</title></rect>')
        out.append(f'<text x="{x + bw / 2:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{escape(cat)}</text>')
    used = [(n, c) for n, c, vals in series if any(v > 0 for v in vals)]
    for k, (name, color) in enumerate(used):
        ly = top + 4 + 16 * k
        out.append(f'<rect x="{width - legend_w + 8}" y="{ly}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{width - legend_w + 22}" y="{ly + 9}">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def memory_svg(report: Any) -> str:
    """Per-rank stacks whose tops are ``RankMemory.peak`` (the terms ``viz.memory_chart`` stacks)."""
    ranks = sorted(report.ranks)
    parts = [memory_parts(report.ranks[r]) for r in ranks]
    series = [(name, color, [p[name] for p in parts]) for name, color in MEMORY_PARTS]
    peak = max((report.ranks[r].peak for r in ranks), default=0)
    return stacked_bars_svg([f"rank {r}" for r in ranks], series, f"memory per device: peak {fmt_bytes(peak)}")


def comm_svg(phys: Any) -> str:
    """Bytes each rank sends per step, stacked by phase and collective (sums to comm_bytes_per_rank)."""
    per = comm_by_rank(phys)
    ranks = sorted(per)
    keys = sorted({k for v in per.values() for k in v})
    series = [(f"{phase} {kind}", category_color(i), [per[r].get((phase, kind), 0) for r in ranks])
              for i, (phase, kind) in enumerate(keys)]
    total = sum(sum(v.values()) for v in per.values())
    return stacked_bars_svg([f"rank {r}" for r in ranks], series, f"bytes sent per step: {fmt_bytes(total)} in all")


def _row(b: Bar) -> str:
    """Rank and lane, with the numbered lanes a trace packs overlapping firings into ("comm 7") merged."""
    head, _, tail = b.lane.rpartition(" ")
    return f"rank {b.rank} · {head if head and tail.isdigit() else b.lane}"


def timeline_svg(bars: Sequence[Bar], width: int = 900, title: str = "timeline") -> str:
    """A row per rank and lane kind, a rect per firing (colour = kind, a collective's = its mesh axis, as in
    the plotly timeline; shade = micro-batch; overlapping
    firings drawn see-through on top of each other), on a microsecond axis."""
    shown = list(bars[:MAX_TIMELINE_BARS])
    rows = list(dict.fromkeys(_row(b) for b in sorted(shown, key=lambda b: (str(b.rank), b.rank,
                                                                              "comm" in b.lane.lower(), b.lane))))
    t0 = min((b.start_us for b in shown), default=0.0)
    span = max((b.start_us + b.dur_us for b in shown), default=0.0) - t0 or 1.0
    left, top, row_h = 130, 28, 18
    plot_w = width - left - 10
    height = top + row_h * len(rows) + 30
    cut = f" (first {len(shown)} of {len(bars)} firings)" if len(bars) > len(shown) else ""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" {FONT} {INK} font-size="10">',
           f'<text x="4" y="15" font-size="12" font-weight="bold">{escape(title)}: {span:.0f} us{escape(cut)}</text>']
    y_of = {row: top + row_h * i for i, row in enumerate(rows)}
    for row, y in y_of.items():
        out.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{escape(row)}</text>'
                   f'<line x1="{left}" y1="{y + row_h}" x2="{left + plot_w}" y2="{y + row_h}" {GRID}/>')
    for b in shown:
        x = left + (b.start_us - t0) / span * plot_w
        w = max(0.5, b.dur_us / span * plot_w)
        color = shade(firing_color(b.kind, b.mesh_axis), b.micro_batch or 0)
        op = b.args.get("op", b.name)
        tip = (f"{op} ({b.kind}) actor {b.args.get('actor', b.name)}, step {b.args.get('step', '-')}, "
               f"micro-batch {'-' if b.micro_batch is None else b.micro_batch}, "
               f"bytes {fmt_bytes(b.args['bytes']) if isinstance(b.args.get('bytes'), (int, float)) else '-'}, "
               f"start {b.start_us - t0:.1f} us, {b.dur_us:.1f} us")
        out.append(f'<rect class="firing" data-kind="{b.kind}" x="{x:.2f}" y="{y_of[_row(b)] + 2}" width="{w:.2f}" '
                   f'height="{row_h - 4}" fill="{color}" fill-opacity="0.75" {AXIS} stroke-width="0.3">'
                   f'<title>{escape(tip)}</title></rect>')
    axis_y = top + row_h * len(rows) + 14
    for k in range(5):
        x = left + plot_w * k / 4
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        out.append(f'<text x="{x:.1f}" y="{axis_y}" text-anchor="{anchor}" {MUTED}>{span * k / 4:.0f}</text>')
    out.append(f'<text x="{left + plot_w}" y="{axis_y + 13}" text-anchor="end" {MUTED}>time (us)</text>')
    out.append("</svg>")
    return "".join(out)
