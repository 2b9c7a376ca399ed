"""Plotly figures on the notebook's own theme: transparent backgrounds, text and grid in the page's colours.

Why a stylesheet: plotly writes every colour into the figure (``fill: rgb(68,68,68)`` on each text) and its
JupyterLab renderer knows no theme, so a figure made for a white page is a white card with grey text
in the dark theme, and one made for a dark page is unreadable in the light one. CSS can follow the
theme (JupyterLab's ``--jp-*`` variables), so the figure's backgrounds are transparent (``TRANSPARENT``)
and a stylesheet paints the axis, legend and title texts and the grid with the page's variables.
Black outlines (the timeline's critical path) take the page's ink too. Bar labels keep the contrast
colour plotly picks against each bar; hover labels keep their own box.

Why not a widget: plotly 6's ``FigureWidget`` is an anywidget whose model carries the whole plotly.js
bundle as its front-end code, and a notebook saved with widget state (``jupyter nbconvert --execute``,
JupyterLab's "save widget state") stores it once per figure: 5.1 MB each, 11 MB for a tutorial with two.
``show`` instead displays two outputs: a tiny HTML one (about 1 kB: a hidden marker and the ``<style>``)
and then plotly's own mime bundle (``application/vnd.plotly.v1+json``, drawn by the jupyterlab-plotly
extension plotly ships, and kept in the saved notebook as the figure's JSON only). The rules reach only
the output right after the marker (``.jp-OutputArea-child:has(marker) + .jp-OutputArea-child``), so no
other figure on the page changes, and the marker's own output takes no room. A front end without
JupyterLab's output classes (VS Code, nbviewer) shows plotly's figure as plotly draws it.

The RunPanel draws its live timeline with the same two outputs (``outputs``), put into an ipywidgets
``Output`` widget that its view holds: one renderer for both, and the saved notebook keeps the figure's
JSON (tens of kB), not plotly.js. The marker's output is matched only as its own output area's child
(``:has(> .jp-OutputArea-output > marker)``), so the notebook output holding the whole panel, which
holds the marker further down, is never hidden.
"""

from __future__ import annotations

from functools import cache
from typing import Any

MARK = "sbplab-plotly-theme"  # the marker of the HTML output placed just before a themed plotly output
# the output that holds the marker itself (not an output that holds a widget holding it), and the next one
MARKED = f".jp-OutputArea-child:has(> .jp-OutputArea-output > .{MARK})"
NEXT_OUTPUT = f"{MARKED} + .jp-OutputArea-child"  # the plotly output after it
TRANSPARENT = "rgba(0,0,0,0)"
INK = "var(--jp-content-font-color1, var(--vscode-editor-foreground, #222))"
GRID = "var(--jp-border-color2, rgba(128,128,128,0.3))"


def rules(scope: str) -> str:
    """The theme's rules for the plotly figure under the CSS selector ``scope``."""
    return (f"{scope} .main-svg text:not(.bartext, .hoverlayer text) {{fill: {INK} !important}}"
            f"{scope} .main-svg .gridlayer path, {scope} .main-svg .zerolinelayer path {{stroke: {GRID} !important}}"
            f"{scope} .main-svg .legend .bg {{fill: transparent !important}}"
            # black outlines (the timeline's critical path) in the page's ink: black vanishes on a dark page
            f'{scope} .main-svg path[style*="stroke: rgb(0, 0, 0)"] {{stroke: {INK} !important}}'
            f"{scope} .modebar-btn path {{fill: {INK} !important; opacity: 0.6}}")


# the page's stylesheet for the plotly output after the marker; the marker's own output is hidden
PAGE_CSS = f"{MARKED} {{display: none}}" + rules(NEXT_OUTPUT)
STYLE_HTML = f'<div class="{MARK}" hidden></div><style>{PAGE_CSS}</style>'


@cache
def figure_class() -> type:
    """plotly's Figure, shown in a notebook on the page's theme (``show``): what ``sl.timeline`` returns."""
    import plotly.graph_objects as go

    class ThemedFigureView(go.Figure):
        """A plotly Figure that a notebook shows on its own light or dark theme."""

        def _ipython_display_(self) -> None:
            if _in_kernel():
                show(self)
            else:  # a terminal IPython: plotly's own renderer (a browser tab)
                super()._ipython_display_()

    return ThemedFigureView


def _in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (a front end that draws mime bundles)."""
    from IPython import get_ipython

    return hasattr(get_ipython(), "kernel")


def bundles(fig: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two mime bundles that draw ``fig`` on the page's theme: the marker with the stylesheet, then
    plotly's own (the figure's JSON, drawn by the jupyterlab-plotly renderer)."""
    import plotly.io as pio

    return {"text/html": STYLE_HTML, "text/plain": ""}, pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())


def outputs(fig: Any) -> tuple[dict[str, Any], ...]:
    """``bundles(fig)`` as notebook outputs, for an ipywidgets ``Output`` widget's ``outputs``."""
    return tuple({"output_type": "display_data", "data": b, "metadata": {}} for b in bundles(fig))


def show(fig: Any) -> None:
    """Display ``fig`` on the page's theme: the marker and stylesheet (a tiny HTML output), then plotly's
    own mime bundle, which the rules reach and nothing else does."""
    from IPython.display import display

    for bundle in bundles(fig):
        display(bundle, raw=True)
