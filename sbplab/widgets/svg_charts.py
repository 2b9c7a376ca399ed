"""Small SVG charts for the widgets: stacked bars per rank.

The notebook pictures of ``sbplab.viz`` are plotly figures; a widget's small charts instead are plain
SVG text from Python (no charting library in the page), built from the same numbers: ``memory_parts``
and ``comm_by_rank``. Every mark carries a ``<title>`` so hovering shows the exact figure. (A run's
timeline is the plotly figure itself: the RunPanel shows ``sl.timeline``'s output in an Output widget.)

Text, axes and grid lines are drawn in ``currentColor`` (lighter ones through opacity), so the chart
takes the text colour of the page around it: JupyterLab's ``--jp-ui-font-color1`` in a widget, light
or dark theme alike, and black on its own. Only the data marks carry fixed hues, which read on both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from ..viz.charts import MEMORY_PARTS, comm_by_rank, memory_parts
from ..viz.colors import category_color
from ..viz.graph_dot import fmt_bytes

FONT = 'font-family="Helvetica, Arial, sans-serif"'
INK = 'fill="currentColor"'  # on the <svg>: every text inherits the surrounding text colour
MUTED = 'fill="currentColor" fill-opacity="0.7"'  # secondary text (axis figures)
AXIS = 'stroke="currentColor" stroke-opacity="0.5"'
GRID = 'stroke="currentColor" stroke-opacity="0.15"'


MIN_SLOT = 18  # px per bar at least: a two-digit rank number at 11 px fits under it, so labels never collide
WIDE_SLOT = 46  # px per bar from which "rank 12" fits under it; narrower slots write the number alone


def stacked_bars_svg(categories: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]], title: str,
                     fmt: Callable[[float], str] = fmt_bytes, width: int = 460, height: int = 220,
                     axis: str = "") -> str:
    """Vertical stacked bars: one bar per category, one segment per non-zero series value.

    Many categories widen the chart (at least ``MIN_SLOT`` px each) instead of squeezing the labels
    into each other; where "rank 12" no longer fits under its bar, the shared prefix moves into an axis
    title (``axis``, e.g. "rank") and each bar keeps its number."""
    left, top, bottom, legend_w = 56, 26, 26, 150
    width = max(width, left + legend_w + MIN_SLOT * len(categories))
    plot_w, plot_h = width - left - legend_w, height - top - bottom
    short = axis and plot_w / max(1, len(categories)) < WIDE_SLOT
    if short:
        categories = [c.removeprefix(axis).strip() for c in categories]
        height += 14
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
    if short:
        out.append(f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 28}" text-anchor="middle" {MUTED}>'
                   f'{escape(axis)}</text>')
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
    return stacked_bars_svg([f"rank {r}" for r in ranks], series, f"memory per device: peak {fmt_bytes(peak)}",
                            axis="rank")


def comm_svg(phys: Any) -> str:
    """Bytes each rank sends per step, stacked by phase and collective (sums to comm_bytes_per_rank)."""
    per = comm_by_rank(phys)
    ranks = sorted(per)
    keys = sorted({k for v in per.values() for k in v})
    series = [(f"{phase} {kind}", category_color(i), [per[r].get((phase, kind), 0) for r in ranks])
              for i, (phase, kind) in enumerate(keys)]
    total = sum(sum(v.values()) for v in per.values())
    return stacked_bars_svg([f"rank {r}" for r in ranks], series, f"bytes sent per step: {fmt_bytes(total)} in all",
                            axis="rank")
