"""Shared by the widgets: exceptions as one-line messages, and a DOT graph as SVG or as text.

A widget never lets an exception out of an observer: the page would show nothing, and the notebook
a traceback about traitlets. What was wrong goes into the widget's ``error`` trait instead.
"""

from __future__ import annotations

from ..viz.dot import dot_available, render_svg

MAX_SVG_NODES = 400  # dot needs ~0.6 ms a node and more: bigger graphs are drawn grouped by module (module_dot)


def error_text(e: BaseException) -> str:
    """The message a person should read: the compiler's errors already say what and where."""
    if isinstance(e, KeyError):
        return str(e).strip("'\"")
    if isinstance(e, (ValueError, TypeError)):  # HintError, GraphError, LayoutError are ValueErrors
        return str(e)
    return f"{type(e).__name__}: {e}"


_last: list[tuple[str, tuple[str, str]]] = []  # the last DOT text drawn and its result


def graph_view(source: str) -> tuple[str, str]:
    """(svg, why not): the SVG where graphviz's ``dot`` exists and the graph is not huge, else "" and
    a note saying why, so the widget shows its text form instead. The same DOT text twice in a row
    (a change that does not touch what is shown) is drawn once."""
    if _last and _last[0][0] == source:
        return _last[0][1]
    out = _graph_view(source)
    _last[:] = [(source, out)]
    return out


def _graph_view(source: str) -> tuple[str, str]:
    nodes = sum(1 for line in source.splitlines() if line.rstrip().endswith("];") and "->" not in line)
    if not dot_available():
        return "", "graphviz's dot program is not installed (Debian: apt-get install graphviz): showing text"
    if nodes > MAX_SVG_NODES:
        return "", f"the graph has {nodes} nodes, too many to draw here: showing text (collapse layers or pick ranks)"
    try:
        return render_svg(source), ""
    except RuntimeError as e:  # dot failed or timed out: the text still says everything
        return "", f"{e}: showing text"
