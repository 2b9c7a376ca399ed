"""A timeline figure follows the notebook's theme: transparent backgrounds, shown as plotly's own mime
bundle after a tiny HTML output whose stylesheet (scoped to the output after its marker) paints text and
grid with the page's variables; the RunPanel's FigureWidget carries the same rules scoped to its class.
The browser test checks the result in JupyterLab's light and dark themes."""

from __future__ import annotations

import re

import plotly.graph_objects as go

from sbplab.viz.plotly_theme import CSS, MARK, NEXT_OUTPUT, PAGE_CSS, THEMED, TRANSPARENT, show, themed_widget
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


def test_show_displays_plotlys_bundle_after_a_small_stylesheet_scoped_to_it(capsys):
    fig = timeline(EVENTS)
    assert show(fig) is None
    out = capsys.readouterr().out
    style, figure = out.index(MARK), out.index("application/vnd.plotly.v1+json")
    assert style < figure  # the marker's output comes first: the rules reach the output after it
    assert "application/vnd.jupyter.widget-view+json" not in out  # no widget: nothing saved but the figure
    assert len(out[:figure]) < 3000 < len(out[figure:])  # the stylesheet is small beside the figure's JSON
    rules = re.findall(r"([^{}]+)\{([^}]*)\}", PAGE_CSS)
    assert rules[0] == (f".jp-OutputArea-child:has(.{MARK}) ", "display: none")  # the marker takes no room
    for sel, _ in rules[1:]:
        assert all(part.strip().startswith(NEXT_OUTPUT + " ") for part in re.split(r",(?![^()]*\))", sel))  # nothing else
    assert [body for _, body in rules[1:]] == [body for _, body in re.findall(r"([^{}]+)\{([^}]*)\}", CSS)]
