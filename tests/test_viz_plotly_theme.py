"""A timeline figure follows the notebook's theme: transparent backgrounds, and shown as plotly's
FigureWidget carrying a stylesheet (scoped to its own class) that paints text and grid with the page's
variables. The browser test checks the result in JupyterLab's light and dark themes."""

from __future__ import annotations

import re

import plotly.graph_objects as go

from sbplab.viz.plotly_theme import CSS, THEMED, TRANSPARENT, show, themed_widget
from sbplab.viz.timeline import compare_timelines, timeline

EVENTS = [{"ph": "X", "name": "f", "pid": 0, "tid": 0, "ts": 0, "dur": 10, "args": {}},
          {"ph": "X", "name": "g", "pid": 1, "tid": 0, "ts": 5, "dur": 10, "args": {}}]


def test_timeline_figures_are_transparent_plotly_figures():
    for fig in (timeline(EVENTS), compare_timelines(EVENTS, EVENTS), timeline(EVENTS, memory={0: [(0, 1), (9, 2)]})):
        assert isinstance(fig, go.Figure)
        assert fig.layout.paper_bgcolor == fig.layout.plot_bgcolor == TRANSPARENT  # the page shows through
    assert len(timeline(EVENTS).data) == len(go.Figure(timeline(EVENTS)).data)


def test_the_widget_brings_a_scoped_stylesheet_in_the_pages_colours():
    w = themed_widget(timeline(EVENTS))
    assert isinstance(w, go.FigureWidget) and THEMED in w._dom_classes and w._css == CSS
    rules = re.findall(r"([^{}]+)\{([^}]*)\}", CSS)
    assert rules and all(sel.strip().startswith(f".{THEMED} ") for sel, _ in rules)  # nothing outside it
    assert "var(--jp-content-font-color1" in CSS and ".bartext" in CSS  # bar labels keep plotly's contrast
    assert len(w.data) == 2 and w.layout.title.text.startswith("timeline")


def test_show_puts_the_widget_view_beside_plotlys_bundle(capsys):
    w = show(timeline(EVENTS))
    out = capsys.readouterr().out
    assert w is not None and w.model_id in out  # the widget view, to the kernel's front end
    assert "application/vnd.plotly.v1+json" in out and "application/vnd.jupyter.widget-view+json" in out
