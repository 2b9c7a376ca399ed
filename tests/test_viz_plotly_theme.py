"""A timeline figure follows the notebook's theme: transparent backgrounds, shown as plotly's own mime
bundle after a tiny HTML output whose stylesheet (scoped to the output after its marker) paints text and
grid with the page's variables; the RunPanel puts the same two outputs into an ipywidgets Output widget.
The browser test checks the result in JupyterLab's light and dark themes."""

from __future__ import annotations

import re

import plotly.graph_objects as go

from sbplab.viz.plotly_theme import (
    MARK,
    MARKED,
    NEXT_OUTPUT,
    PAGE_CSS,
    STYLE_HTML,
    TRANSPARENT,
    outputs,
    show,
)
from sbplab.viz.timeline import compare_timelines, timeline

EVENTS = [{"ph": "X", "name": "f", "pid": 0, "tid": 0, "ts": 0, "dur": 10, "args": {}},
          {"ph": "X", "name": "g", "pid": 1, "tid": 0, "ts": 5, "dur": 10, "args": {}}]


def test_timeline_figures_are_transparent_plotly_figures():
    for fig in (timeline(EVENTS), compare_timelines(EVENTS, EVENTS), timeline(EVENTS, memory={0: [(0, 1), (9, 2)]})):
        assert isinstance(fig, go.Figure)
        assert fig.layout.paper_bgcolor == fig.layout.plot_bgcolor == TRANSPARENT  # the page shows through
    assert len(timeline(EVENTS).data) == len(go.Figure(timeline(EVENTS)).data)


def test_outputs_are_the_two_bundles_show_displays():
    fig = timeline(EVENTS)
    marker, figure = outputs(fig)
    assert marker == {"output_type": "display_data", "data": {"text/html": STYLE_HTML, "text/plain": ""},
                      "metadata": {}}
    assert figure["output_type"] == "display_data"
    assert figure["data"]["application/vnd.plotly.v1+json"]["data"] == fig.to_dict()["data"]
    assert "var(--jp-content-font-color1" in PAGE_CSS and ".bartext" in PAGE_CSS  # bar labels keep plotly's contrast


def test_show_displays_plotlys_bundle_after_a_small_stylesheet_scoped_to_it(capsys):
    fig = timeline(EVENTS)
    assert show(fig) is None
    out = capsys.readouterr().out
    style, figure = out.index(MARK), out.index("application/vnd.plotly.v1+json")
    assert style < figure  # the marker's output comes first: the rules reach the output after it
    assert "application/vnd.jupyter.widget-view+json" not in out  # no widget: nothing saved but the figure
    assert len(out[:figure]) < 3000 < len(out[figure:])  # the stylesheet is small beside the figure's JSON
    rules = re.findall(r"([^{}]+)\{([^}]*)\}", PAGE_CSS)
    assert rules[0] == (f"{MARKED} ", "display: none")  # the marker's own output takes no room
    # only the marker's own output: not an output holding a widget (the RunPanel) that holds the marker
    assert MARKED == f".jp-OutputArea-child:has(> .jp-OutputArea-output > .{MARK})"
    for sel, _ in rules[1:]:
        assert all(part.strip().startswith(NEXT_OUTPUT + " ") for part in re.split(r",(?![^()]*\))", sel))  # nothing else
    assert "var(--jp-content-font-color1" in rules[1][1]
