"""Colours shared by every picture, so rank 3 is the same colour in a layout, a graph and a timeline."""

from __future__ import annotations

import colorsys

# Ranks: Paul Tol's "light" scheme, made for colour-blind readers and for black text on top (a layout
# picture writes each block's label over its rank's colour); golden-angle hues past nine ranks.
_PALETTE = (
    "#77aadd", "#ee8866", "#eedd88", "#ffaabb", "#99ddff", "#44bb99", "#bbcc33", "#aaaa00", "#dddddd",
)

# Okabe & Ito's eight colours (safe for the common colour-vision deficiencies): categories that must tell
# apart, such as the collective kinds of a communication chart.
OKABE_ITO = ("#e69f00", "#56b4e9", "#009e73", "#f0e442", "#0072b2", "#d55e00", "#cc79a7", "#999999")

# Compute is one family of blues, a shade per phase, so "the ranks are computing" reads at a glance;
# communication gets Okabe-Ito's warm and purple hues, one per mesh axis, so data-parallel and
# tensor-parallel collectives tell apart; transfers between placements are vermillion; idle time is a
# pale grey.
KIND_COLORS = {
    "forward": "#56b4e9",
    "backward": "#0072b2",
    "update": "#08306b",
    "collective": "#e69f00",  # a collective whose mesh axis the trace does not say
    "p2p": "#d55e00",
    "idle": "#d9d9d9",
    "other": "#8c6d31",
}

# One hue per mesh axis (axis 0 = the first axis of the placement): orange, reddish purple, bluish green,
# yellow, olive.
AXIS_COLORS = ("#e69f00", "#cc79a7", "#009e73", "#f0e442", "#999933")


def category_color(index: int) -> str:
    """The ``index``-th of a set of categories (Okabe-Ito, cycled): what a stacked chart's series use."""
    return OKABE_ITO[index % len(OKABE_ITO)]


def axis_color(axis: int | None) -> str:
    """The colour of collectives on mesh axis ``axis`` (None: axis unknown)."""
    if axis is None:
        return KIND_COLORS["collective"]
    if axis < 0:
        raise ValueError(f"a mesh axis is >= 0, got {axis}")
    return AXIS_COLORS[axis % len(AXIS_COLORS)]


def firing_color(kind: str, mesh_axis: int | None) -> str:
    """The colour of a firing in every timeline: a collective by its mesh axis, anything else by kind."""
    return axis_color(mesh_axis) if kind == "collective" else KIND_COLORS.get(kind, KIND_COLORS["other"])


def device_color(rank: int) -> str:
    """A stable colour per rank: the palette first, then golden-angle hues for large meshes."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    if rank < len(_PALETTE):
        return _PALETTE[rank]
    h = (rank * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(h, 0.6, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def shade(color: str, index: int, levels: int = 4) -> str:
    """``color`` made lighter or darker by ``index`` (cycled over ``levels``): micro-batch shading."""
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, lum, s = colorsys.rgb_to_hls(r, g, b)
    steps = [0.0, 0.12, -0.1, 0.22, -0.18, 0.3][:max(1, levels)]
    lum = min(0.9, max(0.15, lum + steps[index % len(steps)]))
    r, g, b = colorsys.hls_to_rgb(h, lum, s)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"
