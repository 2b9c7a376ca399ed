"""Pictures of SBP layouts, graphs, traces, memory and communication.

Plain Python and the core package only: plotly is imported when a chart is built, and graphviz's
``dot`` program is run only when a graph is rendered (the DOT text never needs it). In a notebook,
graphs and layout pictures sit in a box that pans and zooms and never draws text under 9 px
(``zoom_box``).
"""

from __future__ import annotations

from ..runtime.schedule_trace import actions_run
from .charts import comm_chart, comm_rows, comm_table, memory_chart
from .dot import DotPicture, dot_available
from .graph_dot import logical_dot, logical_picture
from .layout_picture import DeviceBlock, LayoutPicture, dtype_short, layout_picture, type_string
from .physical_dot import physical_dot, physical_picture
from .register_diagram import register_picture, run_ahead
from .ring_picture import ring_picture, ring_run, ring_steps
from .timeline import compare_timelines, makespan_us, timeline, timeline_bars
from .zoom_box import zoom_box

__all__ = [
    "DeviceBlock", "DotPicture", "actions_run", "LayoutPicture", "comm_chart", "comm_rows", "comm_table",
    "compare_timelines", "dot_available", "dtype_short", "layout_picture", "logical_dot", "logical_picture",
    "makespan_us", "memory_chart", "physical_dot", "physical_picture", "register_picture", "ring_picture",
    "ring_run", "ring_steps", "run_ahead", "timeline", "timeline_bars",
    "type_string", "zoom_box",
]
