"""DOT text helpers and a picture object that renders with graphviz only where ``dot`` is installed.

Graphs are built as DOT text first, so tests read them as text and a machine without graphviz still
gets something useful (the text); the picture renders to SVG when the ``dot`` program exists.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FONT = "Helvetica"


def q(s: object) -> str:
    """A DOT double-quoted string; newlines become DOT's centred line breaks."""
    text = str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def attrs(a: Mapping[str, object]) -> str:
    """``[k="v", ...]`` with every value quoted."""
    return "[" + ", ".join(f"{k}={q(v)}" for k, v in a.items() if v is not None) + "]"


def node(name: str, **a: object) -> str:
    return f"{q(name)} {attrs(a)};"


def edge(src: str, dst: str, **a: object) -> str:
    return f"{q(src)} -> {q(dst)} {attrs(a)};" if a else f"{q(src)} -> {q(dst)};"


def digraph(body: Iterable[str], name: str = "G", rankdir: str = "TB", label: str | None = None) -> str:
    head = [f"digraph {q(name)} {{", f"  rankdir={rankdir}; newrank=true; compound=true;",
            f'  node [fontname={q(FONT)}, fontsize=10]; edge [fontname={q(FONT)}, fontsize=9];']
    if label:
        head.append(f"  label={q(label)}; labelloc=t; fontname={q(FONT)}; fontsize=12;")
    return "\n".join(head + ["  " + line for line in body] + ["}"]) + "\n"


MAX_NODES = 400  # op-level pictures beyond this many nodes are drawn grouped by module (module_dot.py)


def node_count(source: str) -> int:
    """How many nodes a DOT text declares (the lines ``"id" [...];`` that are not edges)."""
    return sum(1 for line in source.splitlines() if line.rstrip().endswith("];") and "->" not in line)


def dot_available() -> bool:
    return shutil.which("dot") is not None


def render_svg(source: str, timeout: float = 60.0) -> str:
    """Run ``dot -Tsvg``; raises with a clear message where graphviz is not installed."""
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError("graphviz's 'dot' program is not installed (Debian: apt-get install graphviz); "
                           "the DOT text is still available as .source")
    out = subprocess.run([exe, "-Tsvg"], input=source.encode(), capture_output=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"dot failed: {out.stderr.decode(errors='replace').strip()}")
    return out.stdout.decode()


@dataclass(frozen=True)
class DotPicture:
    """A graph as DOT text; shows as a pan-and-zoom SVG in a notebook when ``dot`` exists, as text
    otherwise."""

    source: str

    def svg(self) -> str:
        return render_svg(self.source)

    def html(self, min_font_px: float = 9.0, max_height_px: int | None = 640) -> str:
        """The SVG in a box that fills the page width and pans and zooms, its text never drawn under
        ``min_font_px`` pixels (``zoom_box``); what a notebook shows."""
        from .zoom_box import zoom_box

        return zoom_box(self.svg(), min_font_px=min_font_px, max_height_px=max_height_px)

    def to_graphviz(self):
        """A ``graphviz.Source`` (needs the Python package) for saving as PNG/PDF."""
        import graphviz

        return graphviz.Source(self.source)

    def _repr_html_(self) -> str | None:
        return self.html() if dot_available() else None  # else the DOT text (``__str__``)

    def __str__(self) -> str:
        return self.source
