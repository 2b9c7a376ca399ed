"""One self-contained HTML page about a compiled and executed training step.

The page holds what a person reviewing a strategy wants side by side: the losses against plain
PyTorch, the physical graph, the actor timeline, memory per device and the communication table.
Plotly's script is inlined once so the file opens offline; the graph is SVG from Graphviz in a box that
pans and zooms, its text never shrunk below a readable size (or the DOT text where ``dot`` is missing).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .viz import comm_chart, comm_table, memory_chart, physical_picture, timeline
from .viz.dot import dot_available

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table.losses { border-collapse: collapse; } table.losses td, table.losses th { padding: 2px 12px;
  border-bottom: 1px solid #eee; text-align: right; font-family: monospace; }
pre { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 12px; }
.ok { color: #1a7f37; font-weight: bold; } .bad { color: #c62828; font-weight: bold; }
.graph { margin-top: 8px; }
"""


@dataclass
class LossCheck:
    """Losses of the parallel run next to single-device PyTorch's, step by step."""

    parallel: Sequence[float]
    reference: Sequence[float]
    tolerance: float = 1e-4

    @property
    def max_abs_diff(self) -> float:
        return max((abs(a - b) for a, b in zip(self.parallel, self.reference)), default=0.0)

    @property
    def ok(self) -> bool:
        return len(self.parallel) == len(self.reference) and self.max_abs_diff <= self.tolerance


def _losses_html(check: LossCheck) -> str:
    rows = "".join(f"<tr><td>{i}</td><td>{a:.6f}</td><td>{b:.6f}</td><td>{abs(a - b):.2e}</td></tr>"
                   for i, (a, b) in enumerate(zip(check.parallel, check.reference)))
    verdict = ("<span class='ok'>matches single-device PyTorch</span>" if check.ok else
               "<span class='bad'>differs from single-device PyTorch</span>")
    return (f"<p>{verdict} (max |diff| {check.max_abs_diff:.2e}, tolerance {check.tolerance:g})</p>"
            "<table class='losses'><tr><th>step</th><th>sbplab</th><th>torch</th><th>|diff|</th></tr>"
            f"{rows}</table>")


def _figure_html(fig: Any, first: bool) -> str:
    return fig.to_html(full_html=False, include_plotlyjs="inline" if first else False)


def write_report(path: str | Path, compiled: Any, result: Any, check: LossCheck, title: str) -> Path:
    """Write the report for ``compiled`` (a ``Compiled``) run as ``result`` (a ``RunResult``)."""
    path = Path(path)
    pic = physical_picture(compiled.physical, compiled.graph)
    graph = (f"<div class='graph'>{pic.html(max_height_px=900)}</div>" if dot_available()
             else f"<pre>{html.escape(pic.source)}</pre>")
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f"<pre>{html.escape(compiled.summary())}</pre>",
        "<h2>Losses</h2>", _losses_html(check),
        "<h2>Actor timeline</h2>",
        f"<pre>{html.escape(result.trace.summary())}</pre>",
        _figure_html(timeline(result.trace, compiled=compiled,
                              title="every actor firing: compute and communication lanes per rank"), True),
        "<h2>Memory per device</h2>", _figure_html(memory_chart(compiled.memory), False),
        "<h2>Communication</h2>", _figure_html(comm_chart(compiled.physical), False),
        f"<pre>{html.escape(comm_table(compiled.physical))}</pre>",
        "<h2>Physical graph</h2>", graph,
    ]
    path.write_text("<!doctype html><html><head><meta charset='utf-8'>"
                    f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
                    + "\n".join(parts) + "</body></html>")
    return path
