"""Sizes and words of the layout picture: holder labels, tick spacing, and a tensor plane big enough for them.

A 64-rank mesh must not shrink the picture's text below ``MIN_FONT`` px: holder lists are shortened
(``0+1+…+7``), one partial sum per line, ticks thinned where they would touch, and the tensor plane
grows until every block's label fits in it.
"""

from __future__ import annotations

from .layout_picture import LayoutPicture

MIN_FONT = 9  # no text smaller than this (px); a big mesh makes the picture bigger instead
CHAR_W = 0.62  # monospace advance per font px
MAX_GROWTH = 6.0  # the tensor plane grows at most this much to fit its labels
MAX_PLANE_W = 640.0  # and no wider than this (px): a notebook column; a 64-way split wraps or narrows
MESH_LIST_MAX = 8  # ranks written out in the subtitle; bigger meshes are summarised (16 would be wider
# than a notebook column)


def plane_size(rows: int, cols: int, side: float) -> tuple[float, float]:
    """Width and height of a (rows, cols) plane whose longer side is ``side``; never thinner than 30%."""
    big = max(rows, cols, 1)
    return max(side * cols / big, side * 0.3), max(side * rows / big, side * 0.3)


def _runs(xs: list[int], sep: str) -> str:
    """``0+1+2+3`` -> ``0+1+…+3`` when a list of 4 or more ranks steps evenly: a big group stays short."""
    if len(xs) >= 4 and len({b - a for a, b in zip(xs, xs[1:])}) == 1:
        return f"{xs[0]}{sep}{xs[1]}{sep}…{sep}{xs[-1]}"
    return sep.join(map(str, xs))


def holder_lines(pic: LayoutPicture, block) -> list[str]:
    """The holders of ``block`` as short lines: partial-sum groups one per line, evenly stepping rank
    lists shortened, at most four lines (first two, an ellipsis, the last)."""
    groups = pic.holders(block)
    if all(len(g) == 1 for g in groups):
        return [_runs([g[0] for g in groups], ",")]
    lines = [_runs(g, "+") for g in groups]
    if len(lines) > 4:
        lines = lines[:2] + ["…", lines[-1]]
    return [x if x == "…" or i == len(lines) - 1 else x + "," for i, x in enumerate(lines)]


def mesh_text(pic: LayoutPicture) -> str:
    pl = pic.placement
    ranks = list(pl.rank_list)
    if len(ranks) <= MESH_LIST_MAX:
        return str(pl.mesh.tolist())
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks {ranks[0]}..{ranks[-1]} in row-major order"
    return f"ranks {', '.join(map(str, ranks[:8]))}, … (row-major)"


def block_ranges(pic: LayoutPicture, block, dim: int | None) -> tuple[int, int]:
    return block[dim] if dim is not None else (0, 1)


def spaced_cuts(cuts: list[int], where, width) -> list[int]:
    """Cut points whose labels do not touch: the first, then each one far enough from the last kept,
    and the last one (dropping the one before it if they would touch)."""
    kept: list[int] = []
    for c in cuts:
        if not kept or where(c) - where(kept[-1]) >= (width(c) + width(kept[-1])) / 2:
            kept.append(c)
    if cuts and kept[-1] != cuts[-1]:
        while len(kept) > 1 and where(cuts[-1]) - where(kept[-1]) < (width(cuts[-1]) + width(kept[-1])) / 2:
            kept.pop()
        kept.append(cuts[-1])
    return kept


def label_box(lines: list[str], size: int = 11) -> tuple[float, float]:
    """Width and height (px) the holder lines need inside a block."""
    return max(len(x) for x in lines) * size * CHAR_W + 6, len(lines) * (size + 2) + 4


def fit_side(pic: LayoutPicture, base: float) -> float:
    """The plane's longer side: ``base``, or more where a block's holder label would not fit in it,
    so a big mesh gives a bigger picture rather than smaller text (at most ``MAX_GROWTH`` times)."""
    r_dim, c_dim = pic.plane_dims
    rows = pic.shape[r_dim] if r_dim is not None else 1
    cols = pic.shape[c_dim] if c_dim is not None else 1
    side = base
    for _ in range(2):  # the plane's aspect clamp is piecewise linear in side: a second pass settles it
        pw, ph = plane_size(rows, cols, side)
        need = 1.0
        for slab in pic.slabs:
            for blk in pic.plane_blocks(slab):
                (r0, r1), (c0, c1) = block_ranges(pic, blk, r_dim), block_ranges(pic, blk, c_dim)
                w, h = pw * (c1 - c0) / max(cols, 1), ph * (r1 - r0) / max(rows, 1)
                lw, lh = label_box(holder_lines(pic, blk))
                need = max(need, lw / max(w, 1e-9), lh / max(h, 1e-9))
        side = min(base * MAX_GROWTH, side * need)
    return side


def fit_plane(pic: LayoutPicture, base: float, max_w: float = MAX_PLANE_W) -> tuple[float, float]:
    """The plane's (width, height): ``fit_side``'s proportional growth while that fits ``max_w``; past
    it the width stops at ``max_w`` and the height grows on alone if its labels need it (a 64-way row
    split stays a column wide and gets taller; a 64-way column split keeps its width and labels only
    the blocks wide enough)."""
    r_dim, c_dim = pic.plane_dims
    rows = pic.shape[r_dim] if r_dim is not None else 1
    cols = pic.shape[c_dim] if c_dim is not None else 1
    pw, ph = plane_size(rows, cols, fit_side(pic, base))
    if pw <= max_w:
        return pw, ph
    pw0, ph0 = plane_size(rows, cols, base)
    tall = 1.0  # the growth the labels' heights alone need
    for slab in pic.slabs:
        for blk in pic.plane_blocks(slab):
            r0, r1 = block_ranges(pic, blk, r_dim)
            tall = max(tall, label_box(holder_lines(pic, blk))[1] / max(ph0 * (r1 - r0) / max(rows, 1), 1e-9))
    return max_w, ph0 * max(max_w / pw0, min(MAX_GROWTH, tall))
