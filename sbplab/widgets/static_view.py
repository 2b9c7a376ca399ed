"""A widget's static rendering: plain HTML of what it showed, for where no kernel draws it.

A widget in a notebook is a view of a model that lives in the kernel. A saved notebook opened later
(untrusted, on GitHub, in nbviewer, exported to HTML) has no such model; without another
representation it shows the widget's Python repr, or "Error displaying widget: model not found".
So every sbplab widget adds ``text/html`` to its mime bundle beside the widget view: a card with
what it showed when it was displayed (its strategy, tables, charts), marked as a snapshot. A live
JupyterLab still draws the widget itself (it prefers the widget view); untrusted outputs and static
viewers, which take the safe HTML, get the card.

Only tables and preformatted text: what HTML sanitizers keep (an untrusted output loses its SVG and
would spill the charts' labels as loose text). Colours are inherited, so a dark theme reads it as
well as a light one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

STYLE = ("border:1px solid rgba(128,128,128,0.4);border-radius:4px;padding:6px 10px;"
         "font-family:var(--jp-ui-font-family, sans-serif);font-size:13px;color:inherit")


def card(title: str, parts: Iterable[str]) -> str:
    """A bordered card titled ``title`` holding ``parts`` (HTML already escaped), marked as a snapshot."""
    body = "".join(p for p in parts if p)
    return (f'<div class="sbplab-static" style="{STYLE}"><div style="font-weight:600">{escape(title)}</div>'
            f'<div style="opacity:0.85;font-size:12px;margin-bottom:4px">a snapshot of the widget as it was shown: '
            f"run the cell to use it</div>{body}</div>")


def line(text: str, bold: bool = False) -> str:
    if not text:
        return ""
    weight = "font-weight:600;" if bold else ""
    return f'<div style="{weight}margin:2px 0">{escape(text)}</div>'


def pre(text: str, limit: int = 4000) -> str:
    """Preformatted text, cut at ``limit`` characters (a snapshot, not a dump)."""
    if not text:
        return ""
    cut = text if len(text) <= limit else text[:limit] + "\n…"
    return f'<pre style="margin:4px 0;white-space:pre-wrap;font-size:12px">{escape(cut)}</pre>'


def table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    rows = list(rows)
    if not rows:
        return ""
    cell = 'style="padding:1px 8px;text-align:left;border-bottom:1px solid rgba(128,128,128,0.3)"'
    out = ["<table style=\"border-collapse:collapse;font-size:12px;margin:4px 0\"><tr>"]
    out += [f"<th {cell}>{escape(str(h))}</th>" for h in head]
    out.append("</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td {cell}>{escape(str(v))}</td>" for v in r) + "</tr>")
    out.append("</table>")
    return "".join(out)
