"""Colours shared by every picture, so rank 3 is the same colour in a layout, a graph and a timeline."""

from __future__ import annotations

import colorsys

# Tableau 10: distinct, print-friendly, readable with black text on top at ~70% opacity.
_PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)

# One hue per kind of work; micro-batches get lighter or darker shades of it.
KIND_COLORS = {
    "forward": "#4e79a7",
    "backward": "#e15759",
    "update": "#59a14f",
    "communication": "#f28e2b",
    "other": "#9c755f",
}


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
