"""Colours shared by every picture, so rank 3 is the same colour in a layout, a graph and a timeline."""

from __future__ import annotations

import colorsys

# Tableau 10: distinct, print-friendly, readable with black text on top at ~70% opacity.
_PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)

# Compute is one family of blues, a shade per phase, so "the ranks are computing" reads at a glance;
# communication gets warm hues, one per mesh axis, so data-parallel and tensor-parallel collectives
# tell apart; transfers between placements are red; idle time is a pale grey.
KIND_COLORS = {
    "forward": "#6baed6",
    "backward": "#2171b5",
    "update": "#08306b",
    "collective": "#f28e2b",  # a collective whose mesh axis the trace does not say
    "p2p": "#d62728",
    "idle": "#d9d9d9",
    "other": "#9c755f",
}

# One hue per mesh axis (axis 0 = the first axis of the placement): orange, purple, gold, pink, teal.
AXIS_COLORS = ("#f28e2b", "#9467bd", "#d4a92a", "#e377c2", "#17becf")


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
