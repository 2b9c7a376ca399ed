"""An SVG picture in a box that fits the page width, never shrinks text below a readable size, and pans
and zooms.

A graph drawn by graphviz has a natural size (points), and a notebook cell has its own width. Scaled
to fit, a four-rank physical graph would shrink its 9 pt labels to 4 px; drawn at natural size, a
small graph leaves the box mostly empty. So the SVG keeps its viewBox and gets ``width: 100%``,
bounded below by the width at which its smallest text is ``min_font_px`` pixels tall and above by
a little more than its natural size: it fills the box, starts at the top left, and where it is
bigger than the box the box scrolls. No script is needed for that. A small inline script (run where the page allows it:
JupyterLab, VS Code, a saved report) adds zoom buttons, Ctrl/⌘ + wheel zoom around the pointer, and
drag to pan, and scrolls sideways to the graph's first node when graphviz put it beyond the right
edge; without it the picture stays readable and scrollable.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from html import escape

from ..errors import InputError

PX_PER_UNIT = {"pt": 4 / 3, "px": 1.0, "": 1.0, "in": 96.0, "cm": 96 / 2.54, "mm": 9.6 / 2.54}
_SVG_OPEN = re.compile(r"<svg\b[^>]*>", re.S)
_boxes = itertools.count()


@dataclass(frozen=True)
class SvgSize:
    """What sizing an SVG needs: its viewBox, natural width in CSS pixels, and smallest text size in
    viewBox units (after the scale of the group graphviz wraps everything in)."""

    view_w: float
    view_h: float
    natural_w_px: float
    min_font: float

    def min_scale(self, min_font_px: float) -> float:
        """CSS pixels per viewBox unit below which the smallest text is under ``min_font_px``."""
        return min_font_px / self.min_font if self.min_font > 0 else 0.0

    def widths(self, min_font_px: float, grow: float) -> tuple[float, float]:
        """(least, most) CSS width: text at ``min_font_px``, and ``grow`` times the natural size."""
        lo = self.view_w * self.min_scale(min_font_px)
        return lo, max(self.natural_w_px * grow, lo)

    def width_px(self, box_px: float, min_font_px: float, grow: float = 1.0) -> float:
        """The width the picture takes in a box ``box_px`` wide (what the CSS below computes)."""
        lo, hi = self.widths(min_font_px, grow)
        return min(max(box_px, lo), hi)

    def font_px(self, box_px: float, min_font_px: float, grow: float = 1.0) -> float:
        """The smallest text's height in pixels in a box ``box_px`` wide."""
        return self.min_font * self.width_px(box_px, min_font_px, grow) / self.view_w


def _length_px(value: str | None) -> float | None:
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-z]*)\s*", value or "")
    if not m or m.group(2) not in PX_PER_UNIT:
        return None
    return float(m.group(1)) * PX_PER_UNIT[m.group(2)]


def _attr(tag: str, name: str) -> str | None:
    m = re.search(rf'\s{name}="([^"]*)"', tag)
    return m.group(1) if m else None


def svg_size(svg: str) -> SvgSize:
    """Read the size of ``svg``: viewBox, width attribute, and the smallest ``font-size`` of its text."""
    m = _SVG_OPEN.search(svg)
    if m is None:
        raise InputError("not an SVG document: no <svg> element found")
    tag = m.group(0)
    box = _attr(tag, "viewBox")
    if box is None:
        raise InputError("the SVG has no viewBox, so it cannot be scaled to fit; graphviz and sbplab's pictures "
                         "always write one")
    _, _, vw, vh = (float(v) for v in box.replace(",", " ").split())
    natural = _length_px(_attr(tag, "width")) or vw
    scale = 1.0
    g = re.search(r'<g\b[^>]*\stransform="[^"]*scale\(([\d.]+)', svg[m.end():m.end() + 2000])
    if g:  # graphviz wraps the drawing in one group scaled by its dpi / 72
        scale = float(g.group(1))
    sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)(?:px|pt)?"', svg)]
    sizes += [float(x) for x in re.findall(r"font-size:\s*([\d.]+)px", svg)]
    return SvgSize(vw, vh, natural, min(sizes, default=0.0) * scale)


def zoom_box(svg: str, min_font_px: float = 9.0, max_height_px: int | None = 640, title: str = "",
             grow: float = 1.0) -> str:
    """``svg`` in a scrolling box of at most ``max_height_px`` (None: as tall as the picture): as wide
    as the box, never so small that its smallest text is under ``min_font_px`` pixels, never more
    than ``grow`` times its natural size (1: a small graph opens at its own size, never enlarged past
    the cell's edge); with zoom and pan controls (see the module docstring)."""
    if grow < 1 or min_font_px <= 0:
        raise InputError(f"zoom_box needs grow >= 1 and min_font_px > 0, got grow={grow}, min_font_px={min_font_px}")
    size = svg_size(svg)
    lo, hi = size.widths(min_font_px, grow)
    uid = f"slz{hashlib.sha1(svg.encode()).hexdigest()[:8]}-{next(_boxes)}"  # one picture may show twice
    m = _SVG_OPEN.search(svg)
    assert m is not None  # svg_size checked it
    tag = re.sub(r'\s(width|height|preserveAspectRatio|style)="[^"]*"', "", m.group(0))
    tag = tag[:-1].rstrip("/") + (f' width="100%" preserveAspectRatio="xMinYMin meet" '
                                  f'style="display:block;width:100%;height:auto;min-width:{lo:.0f}px;'
                                  f'max-width:{hi:.0f}px">')
    body = svg[m.start():].replace(m.group(0), tag, 1)
    label = f' aria-label="{escape(title)}"' if title else ""
    tall = f"max-height:{max_height_px}px;" if max_height_px else ""
    # a picture that neither grows nor shrinks: the box hugs it instead of stretching across the cell
    fixed = ' style="display:inline-block;max-width:100%;vertical-align:top"' if hi - lo < 1 else ""
    return (f'<div class="sbplab-zoom" id="{uid}" data-min-width="{lo:.0f}" data-natural-width="{hi:.0f}" '
            f'data-min-font-px="{min_font_px:g}"{label}{fixed}>'
            f'<div class="sbplab-zoom-bar" style="display:none;gap:3px;justify-content:flex-end;'
            f'margin-bottom:3px;font:12px sans-serif">{_BUTTONS}</div>'
            f'<div class="sbplab-zoom-view" style="overflow:auto;{tall}cursor:grab;'
            f'border:1px solid rgba(128,128,128,0.3);border-radius:4px;background:transparent;'
            f'color:{INK}">{body}</div>'
            f"<style>{themed_svg_css('#' + uid)}</style>"
            f"<script>{_SCRIPT.replace('UID', uid)}</script></div>")


# The page's text colour (JupyterLab's, VS Code's, else near-black) for what graphviz draws on its page
INK = "var(--jp-content-font-color1, var(--vscode-editor-foreground, #222))"


def themed_svg_css(scope: str) -> str:
    """CSS, scoped under ``scope``, that draws a graphviz picture on the page instead of on a white
    sheet: its background transparent, and what sits on that background (black edges and arrowheads,
    edge and cluster labels, the title) in the page's text colour, so the dark theme shows no white
    card. Node fills are light pastels with their own dark text and are left as drawn."""
    s = scope
    return (f"{s} svg > g.graph > polygon:first-of-type{{fill:transparent}}"
            f"{s} g.edge path[stroke='black'],{s} g.edge polygon[stroke='black'],"
            f"{s} g.cluster polygon[stroke='black']{{stroke:currentColor}}"
            f"{s} g.edge polygon[fill='black']{{fill:currentColor}}"
            f"{s} g.edge text:not([fill]),{s} g.edge text[fill='black'],{s} g.cluster text:not([fill]),"
            f"{s} svg > g.graph > text:not([fill]){{fill:currentColor}}")


_BUTTONS = "".join(
    f'<button type="button" data-zoom="{k}" title="{t}" style="padding:0 7px;cursor:pointer;'
    f'border:1px solid rgba(128,128,128,0.5);border-radius:3px;background:rgba(255,255,255,0.9);'
    f'color:#333">{s}</button>'
    for k, s, t in (("in", "+", "zoom in (Ctrl/⌘ + wheel)"), ("out", "−", "zoom out"),
                    ("fit", "fit", "the whole picture in the box, both ways"), ("reset", "1:1", "readable size, top left")))

# Zoom sets the SVG's width in pixels (its height follows the viewBox); the view box scrolls, so
# panning is scrolling. Zooming keeps the point under the pointer (or the box's centre) in place.
_SCRIPT = """(() => {
  const root = document.getElementById("UID"); if (!root || root.dataset.ready) return;
  root.dataset.ready = "1";
  const view = root.querySelector(".sbplab-zoom-view"), svg = view.querySelector("svg");
  const minW = +root.dataset.minWidth, natW = +root.dataset.naturalWidth;
  root.querySelector(".sbplab-zoom-bar").style.display = "flex";  // the buttons work: show them
  const start = () => {  // the top left, unless the graph's first node is beyond the right edge
    const nodes = [...svg.querySelectorAll("g.node")], left = svg.getBoundingClientRect().left;
    if (!nodes.length || svg.getBoundingClientRect().width <= view.clientWidth) return 0;
    const first = nodes.map((n) => n.getBoundingClientRect()).reduce((a, b) => (b.top < a.top ? b : a));
    return first.right - left <= view.clientWidth ? 0 : Math.max(0, first.left - left - view.clientWidth / 3);
  };
  view.scrollLeft = start();
  const fitWidth = () => {  // the whole picture in the box: its width, and its height in the box's tallest
    const vb = svg.viewBox.baseVal, cap = parseFloat(getComputedStyle(view).maxHeight);
    const tall = (cap > 0 ? cap : window.innerHeight * 0.8) - 2;
    return vb && vb.width > 0 && vb.height > 0 ? Math.min(view.clientWidth, tall * vb.width / vb.height)
      : view.clientWidth;
  };
  const zoomTo = (w, cx, cy) => {
    const old = svg.getBoundingClientRect().width || 1, r = view.getBoundingClientRect();
    const px = cx === undefined ? view.clientWidth / 2 : cx - r.left;
    const py = cy === undefined ? view.clientHeight / 2 : cy - r.top;
    w = Math.max(40, Math.min(w, natW * 8));
    svg.style.minWidth = "0"; svg.style.maxWidth = "none"; svg.style.width = w + "px";
    const k = w / old;
    view.scrollLeft = (view.scrollLeft + px) * k - px; view.scrollTop = (view.scrollTop + py) * k - py;
  };
  root.querySelectorAll("button[data-zoom]").forEach((b) => b.addEventListener("click", () => {
    const w = svg.getBoundingClientRect().width, z = b.dataset.zoom;
    if (z === "in") zoomTo(w * 1.25); else if (z === "out") zoomTo(w / 1.25);
    else if (z === "fit") { zoomTo(fitWidth()); view.scrollLeft = view.scrollTop = 0; }
    else { svg.style.width = "100%"; svg.style.minWidth = minW + "px"; svg.style.maxWidth = natW + "px";
           view.scrollTop = 0; view.scrollLeft = start(); }
  }));
  view.addEventListener("wheel", (e) => {
    if (!(e.ctrlKey || e.metaKey)) return;
    e.preventDefault();
    zoomTo(svg.getBoundingClientRect().width * Math.exp(-e.deltaY * 0.002), e.clientX, e.clientY);
  }, { passive: false });
  let drag = null;
  view.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = [e.clientX, e.clientY, view.scrollLeft, view.scrollTop]; view.style.cursor = "grabbing";
  });
  window.addEventListener("pointermove", (e) => {
    if (!drag) return;
    view.scrollLeft = drag[2] - (e.clientX - drag[0]); view.scrollTop = drag[3] - (e.clientY - drag[1]);
  });
  window.addEventListener("pointerup", () => { drag = null; view.style.cursor = "grab"; });
})();"""
