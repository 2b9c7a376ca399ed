"""Plotly figures on the notebook's own theme: transparent backgrounds, text and grid in the page's colours.

Why a widget: plotly writes every colour into the figure (``fill: rgb(68,68,68)`` on each text) and its
JupyterLab renderer knows no theme, so a figure made for a white page is a white card with grey text
in the dark theme, and one made for a dark page is unreadable in the light one. CSS can follow the
theme (JupyterLab's ``--jp-*`` variables, VS Code's ``--vscode-*``), but a plotly mime bundle brings no
CSS. A plotly ``FigureWidget`` is an anywidget, and an anywidget brings its own: ``ThemedFigure`` is
plotly's FigureWidget with a stylesheet, scoped to its own class, that paints the axis, legend and
title texts and the grid with the page's variables; the figure's backgrounds are transparent
(``TRANSPARENT``). ``show`` displays a figure that way in a kernel (the plotly bundle beside it, for
front ends without widgets); ``sl.timeline``'s figure and the RunPanel use it, so they look alike.
Bar labels keep the contrast colour plotly picks against each bar; hover labels keep their own box.
"""

from __future__ import annotations

from functools import cache
from typing import Any

THEMED = "sbplab-plotly"  # the class of a themed figure's element: the stylesheet applies under it
TRANSPARENT = "rgba(0,0,0,0)"
INK = "var(--jp-content-font-color1, var(--vscode-editor-foreground, #222))"
GRID = "var(--jp-border-color2, rgba(128,128,128,0.3))"

CSS = (f".{THEMED} .main-svg text:not(.bartext, .hoverlayer text) {{fill: {INK} !important}}"
       f".{THEMED} .main-svg .gridlayer path, .{THEMED} .main-svg .zerolinelayer path {{stroke: {GRID} !important}}"
       f".{THEMED} .main-svg .legend .bg {{fill: transparent !important}}"
       f".{THEMED} .modebar-btn path {{fill: {INK} !important; opacity: 0.6}}")


@cache
def _widget_class() -> type:
    import plotly.graph_objects as go

    class ThemedFigure(go.FigureWidget):
        """plotly's FigureWidget with the stylesheet that draws it on the page's theme."""

        _css = CSS

    return ThemedFigure


@cache
def figure_class() -> type:
    """plotly's Figure, shown in a notebook as a themed widget (``show``): what ``sl.timeline`` returns."""
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
    """Whether this runs in a Jupyter kernel (a front end that can draw widgets)."""
    from IPython import get_ipython

    return hasattr(get_ipython(), "kernel")


def themed_widget(fig: Any) -> Any:
    """A FigureWidget of ``fig`` that follows the notebook's light or dark theme."""
    w = _widget_class()(fig)
    w.add_class(THEMED)
    return w


def show(fig: Any) -> Any:
    """Display ``fig`` as a themed widget, with plotly's own bundle beside it (what a front end without
    widgets, or a saved notebook opened untrusted, renders). Returns the widget (None when ipywidgets
    cannot display one here: plotly's bundle alone is shown)."""
    import plotly.io as pio
    from IPython.display import display

    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
    try:
        w = themed_widget(fig)
        view = w._repr_mimebundle_()
    except Exception:  # no kernel with widgets (a plain Python session): plotly's bundle only
        display(bundle, raw=True)
        return None
    data = dict(view[0] if isinstance(view, tuple) else view)
    data.pop("text/plain", None)  # plotly's own text stays
    display({**bundle, **data}, raw=True)
    return w
