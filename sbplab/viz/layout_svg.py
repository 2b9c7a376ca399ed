"""The layout picture as self-contained SVG: the tensor cut into blocks, then every device's share.

Top: the tensor (last two dims as a plane, one panel per leading-dim slab), each block filled with
the colours of the ranks that hold it and labelled with them ("0+1" for partial addends, "0,1" for
copies). Bottom: the device mesh, one tile per rank, showing the outline of the tensor with that
rank's block filled in, its local type written underneath. Partial values are striped. Sizes are
proportional, so uneven splits are visible. Elements carry ``class`` and ``data-*`` attributes so
tests and browsers can read the picture back.

The page behind, the tiles and the text take the notebook theme's colours (CSS variables, with the
light colours as fallbacks: a saved .svg file or an image viewer shows the light picture), so the dark
theme shows no white card; the ranks' colours and the labels on them are the same in both themes.
"""

from __future__ import annotations

import hashlib
from html import escape

from ..sbp import fmt_sbp
from .colors import device_color
from .layout_labels import (
    CHAR_W,
    MAX_PLANE_W,
    MIN_FONT,
    block_ranges,
    fit_plane,
    fit_side,
    holder_lines,
    label_box,
    mesh_text,
    plane_size,
    spaced_cuts,
)
from .layout_picture import DeviceBlock, LayoutPicture, fmt_range, partial_word

FONT = "font-family:ui-monospace,Menlo,Consolas,monospace"
PAGE = "var(--jp-layout-color0, var(--vscode-editor-background, #fff))"  # what the picture sits on
PANEL = "var(--jp-layout-color1, #fafafa)"  # a device's tile
EMPTY = "var(--jp-layout-color2, #eee)"  # the part of the tensor a device does not hold
SHARED = "var(--jp-layout-color2, #e6e6e6)"  # a block several ranks hold (their chips on it)
STRIPE = "var(--jp-layout-color3, #bbb)"  # the stripes of a partial block several ranks hold
INK = "var(--jp-content-font-color1, var(--vscode-editor-foreground, #222))"
HALO = f"paint-order:stroke;stroke:{PAGE};stroke-width:3px;stroke-linejoin:round"
PAD = 10
WRAP_1D = 8  # tiles per row for a 1-D mesh
AGGREGATE_FROM = 8  # more devices than this: devices holding the same block share one tile ("ranks 0-3")
DEVICES_W = 440.0  # past AGGREGATE_FROM devices, the tiles wrap to this width (half a notebook's width)
MAX_TILES = 16  # tiles drawn at most; the rest are named in one line (the tensor view shows their blocks)
WRAP_SLABS = 4  # slab panels per row


class _Svg:
    """A tiny SVG builder: a list of element strings and a running bounding box."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.w = 0.0
        self.h = 0.0

    def add(self, s: str, right: float = 0.0, bottom: float = 0.0) -> None:
        self.parts.append(s)
        self.w, self.h = max(self.w, right), max(self.h, bottom)

    def text(self, x: float, y: float, s: str, size: int = 11, cls: str = "label", anchor: str = "start",
             weight: str = "normal", halo: bool = False, ink: bool = True) -> None:
        """ink: the theme's text colour (on the page, a tile, or a halo); else black (on a rank's colour)."""
        size = max(size, MIN_FONT)
        style = FONT + (f";fill:{INK}" if ink else "") + (";" + HALO if halo else "")
        self.add(f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'font-weight="{weight}" style="{style}">{escape(s)}</text>',
                 x + (len(s) * size * 0.62 if anchor == "start" else len(s) * size * 0.31), y + 4)


def _fill(pic_id: str, rank: int, partial: bool) -> str:
    return f"url(#{pic_id}-p{rank})" if partial else device_color(rank)


def _axis_map(pic: LayoutPicture, dim: int | None, origin: float, length: float):
    """Map a global index along ``dim`` to a coordinate along ``length``."""
    n = pic.shape[dim] if dim is not None else 1

    def f(i: int) -> float:
        return origin + length * i / max(n, 1)

    return f


def _tensor_view(svg: _Svg, pic: LayoutPicture, pic_id: str, top: float) -> float:
    r_dim, c_dim = pic.plane_dims
    rows = pic.shape[r_dim] if r_dim is not None else 1
    cols = pic.shape[c_dim] if c_dim is not None else 1
    side = fit_side(pic, 190.0 if len(pic.slabs) == 1 else 130.0)
    pw, ph = plane_size(rows, cols, side)
    svg.text(PAD, top + 12, "tensor: who holds each block", cls="section", weight="bold")
    top += 22
    if pw > MAX_PLANE_W and r_dim is None:  # a 1-D tensor cut in many blocks: its row wraps, as text does
        return _wrapped_row(svg, pic, pic_id, top)
    pw, ph = fit_plane(pic, 190.0 if len(pic.slabs) == 1 else 130.0)  # at most a column wide
    bottom = top
    unlabelled = 0
    for k, slab in enumerate(pic.slabs):
        x0 = PAD + 34 + (k % WRAP_SLABS) * (pw + 60)
        y0 = top + (k // WRAP_SLABS) * (ph + 50) + (16 if slab else 0)
        if slab:
            svg.text(x0, y0 - 5, f"{pic.name}{pic.slab_label(slab)}", cls="slab-label")
        xmap, ymap = _axis_map(pic, c_dim, x0, pw), _axis_map(pic, r_dim, y0, ph)
        for blk in pic.plane_blocks(slab):
            (r0, r1), (c0, c1) = block_ranges(pic, blk, r_dim), block_ranges(pic, blk, c_dim)
            x, y, w, h = xmap(c0), ymap(r0), xmap(c1) - xmap(c0), ymap(r1) - ymap(r0)
            unlabelled += not _block(svg, pic, pic_id, blk, x, y, w, h)
        # axis ticks: the cut points, so uneven splits read as numbers too (thinned where they would touch)
        if c_dim is not None:
            cuts = sorted({e for b in pic.plane_blocks(slab) for e in b[c_dim]})
            for c in spaced_cuts(cuts, xmap, lambda c: len(str(c)) * MIN_FONT * CHAR_W + 4):
                svg.text(xmap(c), y0 + ph + 12, str(c), size=MIN_FONT, cls="tick", anchor="middle")
        if r_dim is not None:
            cuts = sorted({e for b in pic.plane_blocks(slab) for e in b[r_dim]})
            for r in spaced_cuts(cuts, ymap, lambda r: MIN_FONT + 2):
                svg.text(x0 - 4, ymap(r) + 3, str(r), size=MIN_FONT, cls="tick", anchor="end")
        bottom = max(bottom, y0 + ph + 16)
    dims = f"rows = dim {r_dim}, cols = dim {c_dim}" if r_dim is not None else (
        f"one row = dim {c_dim}" if c_dim is not None else "scalar")
    if unlabelled:
        dims += f"; {unlabelled} blocks too narrow to label: hover one for its holders"
    svg.text(PAD, bottom + 10, dims, size=9, cls="note")
    return bottom + 18


def _wrapped_row(svg: _Svg, pic: LayoutPicture, pic_id: str, top: float) -> float:
    """A 1-D tensor whose blocks' labels would make its row wider than ``MAX_PLANE_W``: the row is cut
    between blocks into lines, on one scale (pixels per index, so sizes still compare), each line
    with its start and end index, like wrapped text."""
    c_dim = pic.plane_dims[1]
    blocks = sorted(pic.plane_blocks(pic.slabs[0]), key=lambda b: b[c_dim][0])
    longest = max(b[c_dim][1] - b[c_dim][0] for b in blocks)
    need = max(label_box(holder_lines(pic, b))[0] / max(1, b[c_dim][1] - b[c_dim][0]) for b in blocks)
    scale = min(need, MAX_PLANE_W / max(longest, 1))  # px per index: every label fits, no block too wide
    lines: list[list] = [[]]
    for b in blocks:
        width = sum(x[c_dim][1] - x[c_dim][0] for x in lines[-1]) * scale
        if lines[-1] and width + (b[c_dim][1] - b[c_dim][0]) * scale > MAX_PLANE_W:
            lines.append([])
        lines[-1].append(b)
    h, x0, y = 26.0, PAD + 34, top
    unlabelled = 0
    for line in lines:
        start = line[0][c_dim][0]
        for b in line:
            c0, c1 = b[c_dim]
            unlabelled += not _block(svg, pic, pic_id, b, x0 + (c0 - start) * scale, y, (c1 - c0) * scale, h)
        def at(c: int, start: int = start) -> float:
            return x0 + (c - start) * scale

        for c in spaced_cuts([start] + [b[c_dim][1] for b in line], at, lambda c: len(str(c)) * MIN_FONT * CHAR_W + 4):
            svg.text(at(c), y + h + 12, str(c), size=MIN_FONT, cls="tick", anchor="middle")
        y += h + 22
    note = f"one row = dim {c_dim}, wrapped in {len(lines)} lines"
    if unlabelled:
        note += f"; {unlabelled} blocks too narrow to label: hover one for its holders"
    svg.text(PAD, y + 2, note, size=9, cls="note")
    return y + 10


def _block(svg: _Svg, pic: LayoutPicture, pic_id: str, blk, x: float, y: float, w: float, h: float) -> bool:
    """One block of the tensor: its holder's colour, or grey with a chip per holder when copied; whether
    its holders are written on it (a block narrower than its label has them in its hover title only).

    Copies are drawn as chips, not as bands across the block, so they never read as a further split.
    """
    groups = pic.holders(blk)
    ranks = [r for g in groups for r in g]
    partial = bool(pic.block_of(ranks[0]).partial_axes)
    label = pic.holder_label(blk)
    rng = ",".join(f"{s}:{e}" for s, e in blk)
    if len(ranks) == 1:
        fill = _fill(pic_id, ranks[0], partial)
    else:
        fill = f"url(#{pic_id}-pgrey)" if partial else "#e6e6e6"
    themed = f' style="fill:{SHARED}"' if len(ranks) > 1 and not partial else ""  # grey on the page's theme
    cls = "cell partial" if partial else "cell"
    svg.add(f'<rect class="{cls}" data-block="{rng}" data-holders="{escape(label)}" x="{x:.1f}" '
            f'y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{themed} fill-opacity="0.85" '
            f'stroke="#333" stroke-width="1"><title>{escape(label)}</title></rect>', x + w, y + h)
    cw, sep = 18.0, 9.0
    total = len(ranks) * cw + (len(ranks) - 1) * sep
    if len(ranks) == 1 or total > w - 4 or h < 16:
        lines = holder_lines(pic, blk)
        lw, lh = label_box(lines)
        if lw > w + 0.5 or lh > h + 4:  # it would touch its neighbours' labels
            return False
        top = y + h / 2 + 4 - (len(lines) - 1) * 13 / 2
        for i, line in enumerate(lines):
            svg.text(x + w / 2, top + 13 * i, line, size=11, cls="holders", anchor="middle", halo=True)
        return True
    cx, cy = x + (w - total) / 2, y + h / 2 - 7
    for gi, g in enumerate(groups):
        for ri, r in enumerate(g):
            svg.add(f'<rect class="chip" data-rank="{r}" x="{cx:.1f}" y="{cy:.1f}" width="{cw:.1f}" '
                    f'height="14" rx="3" fill="{device_color(r)}" stroke="#333" stroke-width="0.6"/>')
            svg.text(cx + cw / 2, cy + 11, str(r), size=10, cls="chip-label", anchor="middle", ink=False)
            cx += cw
            last = gi == len(groups) - 1 and ri == len(g) - 1
            if not last:
                svg.text(cx + sep / 2, cy + 11, "+" if ri < len(g) - 1 else ",", size=10, cls="sep",
                         anchor="middle")
                cx += sep
    return True


def _tile_positions(pic: LayoutPicture) -> dict[int, tuple[int, int, int]]:
    """rank -> (group, row, col): 1-D meshes wrap, 2-D meshes are a grid, more axes become groups."""
    out = {}
    shape = pic.placement.shape
    for b in pic.blocks:
        c = b.coords
        if len(c) == 1:
            out[b.rank] = (0, c[0] // WRAP_1D, c[0] % WRAP_1D)
        else:
            g = 0
            for a, ci in enumerate(c[:-2]):
                g = g * shape[a] + ci
            out[b.rank] = (g, c[-2], c[-1])
    return out


def _rank_list(ranks: list[int]) -> str:
    """``0-3, 8-11``: runs of consecutive ranks shortened."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{a[0]}-{a[-1]}" if len(a) > 2 else ", ".join(map(str, a)) for a in runs)


def _aggregated(svg: _Svg, pic: LayoutPicture, pic_id: str, top: float, pw: float, ph: float, tw: float,
                th: float) -> float:
    """Many devices: one tile per distinct block (its holders listed), wrapped to ``DEVICES_W``, at most
    ``MAX_TILES`` tiles, so 16 or 64 ranks aggregate instead of spreading past a notebook column."""
    classes: dict[tuple, list[DeviceBlock]] = {}
    for b in sorted(pic.blocks, key=lambda b: b.rank):
        classes.setdefault((b.block, b.partial_axes), []).append(b)
    tiles = list(classes.values())
    per_row = max(1, min(len(tiles), int(DEVICES_W // tw)))
    bottom = top
    for i, members in enumerate(tiles[:MAX_TILES]):
        x, y = PAD + (i % per_row) * tw, top + (i // per_row) * th
        ranks = [m.rank for m in members]
        name = f"rank {ranks[0]} ({','.join(map(str, members[0].coords))})" if len(ranks) == 1 else \
            f"ranks {_rank_list(ranks)}"
        _tile(svg, pic, pic_id, members[0], x, y, pw, ph, tw, name=name, ranks=ranks)
        bottom = max(bottom, y + th)
    rest = [m.rank for members in tiles[MAX_TILES:] for m in members]
    if rest:
        svg.text(PAD, bottom + 10, f"ranks {_rank_list(rest)}: a block each, drawn in the tensor above",
                 size=10, cls="more-devices")
        bottom += 16
    return bottom + 4


def _device_view(svg: _Svg, pic: LayoutPicture, pic_id: str, top: float) -> float:
    r_dim, c_dim = pic.plane_dims
    rows = pic.shape[r_dim] if r_dim is not None else 1
    cols = pic.shape[c_dim] if c_dim is not None else 1
    pw, ph = plane_size(rows, cols, 80.0)
    tw, th = max(pw, 86.0) + 14, ph + 58
    pl = pic.placement
    axes = "  ".join(f"{pl.axis_label(a)}: {x!r}" for a, x in enumerate(pic.sbp))
    how = {1: "", 2: f"  (rows = {pl.axis_label(0)}, cols = {pl.axis_label(1)})"}.get(
        pl.ndim, f"  (groups = {', '.join(pl.axis_label(a) for a in range(pl.ndim - 2))})")
    many = len(pic.blocks) > AGGREGATE_FROM
    svg.text(PAD, top + 12, f"devices: {axes}" + ("" if many else how), cls="section", weight="bold")
    top += 22
    if many:
        return _aggregated(svg, pic, pic_id, top, pw, ph, tw, th)
    pos = _tile_positions(pic)
    n_cols = max(p[2] for p in pos.values()) + 1
    group_w = n_cols * tw + 18
    bottom = top
    for b in pic.blocks:
        g, r, c = pos[b.rank]
        gx = PAD + g * group_w
        if pl.ndim > 2 and r == 0 and c == 0:
            lead = ",".join(f"{pl.axis_label(a)}={b.coords[a]}" for a in range(pl.ndim - 2))
            svg.text(gx, top + 10, lead, cls="group-label", size=10)
        x, y = gx + c * tw, top + (14 if pl.ndim > 2 else 0) + r * th
        bottom = max(bottom, y + th)
        _tile(svg, pic, pic_id, b, x, y, pw, ph, tw)
    return bottom + 4


def _tile(svg: _Svg, pic: LayoutPicture, pic_id: str, b: DeviceBlock, x: float, y: float,
          pw: float, ph: float, tw: float, name: str | None = None, ranks: list[int] | None = None) -> None:
    """One device's tile (or, ``name``d with its ``ranks``, the tile of several holding the same block)."""
    r_dim, c_dim = pic.plane_dims
    partial = bool(b.partial_axes)
    coords = ",".join(map(str, b.coords))
    shape = ",".join(map(str, b.local_shape))
    held = ",".join(map(str, ranks or [b.rank]))
    svg.add(f'<g class="device" data-rank="{b.rank}" data-ranks="{held}" data-coords="{coords}" '
            f'data-local-shape="{shape}">')
    svg.add(f'<rect class="tile" x="{x:.1f}" y="{y:.1f}" width="{tw - 6:.1f}" height="{ph + 52:.1f}" '
            f'rx="4" fill="#fafafa" style="fill:{PANEL}" stroke="{device_color(b.rank)}" stroke-width="1.5"/>')
    svg.text(x + 5, y + 12, name or f"rank {b.rank} ({coords})", size=10, cls="rank-label", weight="bold")
    px, py = x + 5, y + 18
    svg.add(f'<rect class="outline" x="{px:.1f}" y="{py:.1f}" width="{pw:.1f}" height="{ph:.1f}" '
            f'fill="#eee" style="fill:{EMPTY}" stroke="#999" stroke-width="0.8"/>')
    xmap, ymap = _axis_map(pic, c_dim, px, pw), _axis_map(pic, r_dim, py, ph)
    (r0, r1), (c0, c1) = block_ranges(pic, b.block, r_dim), block_ranges(pic, b.block, c_dim)
    cls = "held partial" if partial else "held"
    rng = ",".join(f"{s}:{e}" for s, e in b.block)
    svg.add(f'<rect class="{cls}" data-rank="{b.rank}" data-ranks="{held}" data-block="{rng}" x="{xmap(c0):.1f}" '
            f'y="{ymap(r0):.1f}" width="{xmap(c1) - xmap(c0):.1f}" height="{ymap(r1) - ymap(r0):.1f}" '
            f'fill="{_fill(pic_id, b.rank, partial)}" fill-opacity="0.85" stroke="#333" stroke-width="0.8"/>',
            x + tw, y + ph + 52)
    svg.text(x + 5, py + ph + 13, pic.local_type(b.rank), size=10, cls="local-type")
    lead = len(pic.slabs[0])
    extra = []
    if lead:
        extra.append("[" + ",".join(fmt_range(r, n) for r, n in zip(b.block[:lead], pic.shape)) + ",…]")
    if partial:
        ops = "/".join(sorted({repr(pic.sbp[a]) for a in b.partial_axes}))
        extra.append(f"{ops} {partial_word(ops.split('/'))}")
    if extra:
        svg.text(x + 5, py + ph + 26, " ".join(extra), size=9, cls="partial-note" if partial else "slab-note")
    svg.add("</g>")


def layout_svg(pic: LayoutPicture) -> str:
    """The whole picture as one ``<svg>`` string with no external references."""
    key = repr((pic.shape, pic.placement, pic.sbp, pic.dtype, pic.name)).encode()
    pic_id = "sl" + hashlib.sha1(key).hexdigest()[:8]
    svg = _Svg()
    pl = pic.placement
    svg.text(PAD, 16, pic.summary(), size=12, cls="title", weight="bold")
    svg.text(PAD, 31, f"SBP {fmt_sbp(pic.sbp)} on {pl.device_type or 'device-free'} mesh "
             f"{'x'.join(map(str, pl.shape))} {mesh_text(pic)}", size=10, cls="subtitle")
    y = _tensor_view(svg, pic, pic_id, 40)
    y = _device_view(svg, pic, pic_id, y + 4)
    if any(b.partial_axes for b in pic.blocks):
        svg.text(PAD, y + 10, "striped = partial value (P): reducing the ranks' values gives the tensor",
                 size=9, cls="legend")
        y += 16
    defs = [f'<pattern id="{pic_id}-pgrey" class="stripes" patternUnits="userSpaceOnUse" width="6" '
            f'height="6" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff" style="fill:{PANEL}"/>'
            f'<rect width="3" height="6" fill="#bbb" style="fill:{STRIPE}"/></pattern>']
    for b in pic.blocks:
        if b.partial_axes:
            col = device_color(b.rank)
            defs.append(f'<pattern id="{pic_id}-p{b.rank}" class="stripes" patternUnits="userSpaceOnUse" '
                        f'width="6" height="6" patternTransform="rotate(45)"><rect width="6" height="6" '
                        f'fill="#fff"/><rect width="3" height="6" fill="{col}"/></pattern>')
    w, h = svg.w + PAD, y + PAD
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="sbplab-layout" width="{w:.0f}" '
            f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}">'
            f'<defs>{"".join(defs)}</defs><rect class="page" width="100%" height="100%" fill="#fff" '
            f'style="fill:{PAGE}"/>'
            + "".join(svg.parts) + "</svg>")
