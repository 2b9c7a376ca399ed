"""The layout picture tells the truth: its blocks, labels and stripes match sbplab.layout."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.layout import LayoutError
from sbplab.viz import layout_picture, type_string

NS = "{http://www.w3.org/2000/svg}"


def svg_tree(pic) -> ET.Element:
    return ET.fromstring(pic.to_svg())


def rects(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{NS}rect") if cls in (e.get("class") or "").split()]


def parse_block(s: str) -> tuple[tuple[int, int], ...]:
    return tuple(tuple(int(v) for v in part.split(":")) for part in s.split(","))


def test_1d_mesh_uneven_split_blocks_and_sizes():
    mesh = sl.Placement("cpu", 3)
    pic = layout_picture((10,), mesh, "S(0)")
    root = svg_tree(pic)
    held = {int(r.get("data-rank")): r for r in rects(root, "held")}
    assert sorted(held) == [0, 1, 2]
    for rank, r in held.items():
        assert parse_block(r.get("data-block")) == sl.local_block((10,), mesh, (sl.S(0),), rank)
    # drawn widths are proportional to the uneven pieces 4, 3, 3
    widths = [float(held[r].get("width")) for r in range(3)]
    assert widths[0] / widths[1] == pytest.approx(4 / 3, rel=0.02)
    assert widths[1] == pytest.approx(widths[2], rel=0.02)
    tiles = {int(g.get("data-rank")): g.get("data-local-shape") for g in root.iter(f"{NS}g")}
    assert tiles == {0: "4", 1: "3", 2: "3"}
    assert pic.uneven and pic.local_types() == ["f32[4]", "f32[3]"]
    grid = pic.grid_text()
    assert re.search(r"0:4\s+4:7\s+7:10", grid)
    assert re.search(r"│\s*0\s*│\s*1\s*│\s*2\s*│", grid)


def test_2d_mesh_grid_of_blocks_matches_local_block():
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    nd = (sl.S(0), sl.S(1))
    pic = layout_picture((8, 6), mesh, nd)
    root = svg_tree(pic)
    cells = {parse_block(c.get("data-block")): c.get("data-holders") for c in rects(root, "cell")}
    expect = {sl.local_block((8, 6), mesh, nd, r): str(r) for r in range(4)}
    assert cells == expect
    for g in root.iter(f"{NS}g"):
        rank = int(g.get("data-rank"))
        assert g.get("data-coords") == ",".join(map(str, mesh.coords(rank)))
        local = tuple(int(v) for v in g.get("data-local-shape").split(","))
        assert local == sl.local_shape((8, 6), mesh, nd, rank)
    text = pic.text()
    assert "f32[8@dp,6@tp]" in text
    assert re.search(r"^3\s+\(1,1\)\s+\[4:8, 3:6\]\s+f32\[4,3\]\s+slice$", text, re.M)


def test_partial_is_striped_and_labelled_as_addends():
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    pic = layout_picture((7, 6), mesh, "S(0), P")
    root = svg_tree(pic)
    held = rects(root, "held")
    assert len(held) == 4 and all("partial" in h.get("class") for h in held)
    pattern_ids = {p.get("id") for p in root.iter(f"{NS}pattern")}
    for h in held:
        m = re.fullmatch(r"url\(#(.+)\)", h.get("fill"))
        assert m and m.group(1) in pattern_ids and m.group(1).endswith(f"-p{h.get('data-rank')}")
    cells = {c.get("data-holders") for c in rects(root, "cell")}
    assert cells == {"0+1", "2+3"}  # addends over mesh axis 1, one block per axis-0 piece
    assert "P addend over axis1" in pic.rank_table()
    assert pic.type_string() == "f32[7@axis0,6]{P:axis1}"
    # a max-partial holds candidates, not addends
    maxed = layout_picture((7, 6), mesh, "S(0), P(max)")
    assert "P(max) candidate over axis1" in maxed.rank_table() and "P(max) candidate" in maxed.to_svg()
    # no stripes without P
    plain = svg_tree(layout_picture((7, 6), mesh, "S(0), B"))
    assert not any("partial" in h.get("class") for h in rects(plain, "held"))
    assert not any(h.get("fill").startswith("url(") for h in rects(plain, "held"))


def test_broadcast_copies_show_every_holder_as_a_chip():
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    pic = layout_picture((4, 4), mesh, "B, P")
    root = svg_tree(pic)
    (cell,) = rects(root, "cell")
    assert cell.get("data-holders") == "0+1,2+3"
    assert sorted(int(c.get("data-rank")) for c in rects(root, "chip")) == [0, 1, 2, 3]
    assert "0+1,2+3" in pic.grid_text()


def test_3d_mesh_and_3d_tensor_show_one_panel_per_slab():
    mesh = sl.Placement("cpu", [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    nd = (sl.S(0), sl.S(1), sl.B)
    pic = layout_picture((4, 7, 6), mesh, nd)
    assert pic.slabs == [((0, 2),), ((2, 4),)]
    root = svg_tree(pic)
    labels = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "slab-label"]
    assert labels == ["[0:2, :, :]", "[2:4, :, :]"]  # a bare shape has no name to put in front
    groups = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "group-label"]
    assert groups == ["axis0=0", "axis0=1"]
    held = {int(r.get("data-rank")): parse_block(r.get("data-block")) for r in rects(root, "held")}
    assert held == {r: sl.local_block((4, 7, 6), mesh, nd, r) for r in range(8)}
    cells = {c.get("data-holders") for c in rects(root, "cell")}
    assert cells == {"0,1", "2,3", "4,5", "6,7"}
    assert pic.local_types() == ["f32[2,4,6]", "f32[2,3,6]"]


def test_type_strings():
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    assert type_string((8, 4), mesh, "S(0), B") == "f32[8@dp,4]"
    assert type_string((8, 4), mesh, "S(0), S(0)") == "f32[8@(dp,tp),4]"
    assert type_string((8, 4), mesh, "P(max), S(-1)", torch.bfloat16) == "bf16[8,4@tp]{P(max):dp}"
    assert type_string((8, 4), mesh, "P, P", "int64") == "i64[8,4]{P:dp,tp}"
    pic = layout_picture(torch.Size([9, 4]), mesh, "S(0), B", name="w")
    assert pic.summary() == "w: f32[9@dp,4] (S(0), B) local f32[5,4] | f32[4,4]"


def test_bad_input_gives_clear_errors():
    mesh = sl.Placement("cpu", 4)
    with pytest.raises(LayoutError, match=r"dim 0 has 3 elements .* split into 4 parts"):
        layout_picture((3, 5), mesh, "S(0)")
    with pytest.raises(ValueError, match="2 entries but the placement's mesh has 1 axes"):
        layout_picture((8, 5), mesh, "S(0), B")
    with pytest.raises(ValueError, match="S\\(2\\) is out of range for a 2-D tensor"):
        layout_picture((8, 5), mesh, "S(2)")
    with pytest.raises(ValueError, match="needs placement= and sbp="):
        layout_picture((8, 5))


def test_picture_of_a_global_tensor_matches_its_shards_and_reprs():
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    x = sl.tensor(torch.randn(7, 6, dtype=torch.float16), placement=mesh, sbp="S(0), S(1)")
    pic = layout_picture(x, name="h")
    assert pic.summary().startswith("h: f16[7@axis0,6@axis1]")
    for rank, local in x.shards.items():
        assert pic.block_of(rank).local_shape == tuple(local.shape)
        assert pic.local_type(rank) == f"f16[{','.join(map(str, local.shape))}]"
    html = pic._repr_html_()
    assert html.count("<svg") == 1 and "f16[4,3]" in html and "f16[3,3]" in html
    ET.fromstring(pic._repr_svg_())  # well-formed


_sbp1 = st.one_of(st.just("B"), st.just("P"), st.integers(0, 2).map(lambda d: f"S({d})"))


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       mesh_shape=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       entries=st.lists(_sbp1, min_size=3, max_size=3))
def test_picture_blocks_partition_the_tensor(shape, mesh_shape, entries):
    n = math.prod(mesh_shape)
    mesh = sl.Placement("cpu", torch.arange(n).reshape(mesh_shape).tolist())
    fit = [e if not e.startswith("S") or int(e[2]) < len(shape) else "B" for e in entries[:len(mesh_shape)]]
    sbp = ", ".join(fit)
    try:
        pic = layout_picture(tuple(shape), mesh, sbp)
    except LayoutError:
        return
    nd = pic.sbp
    root = svg_tree(pic)
    # every device's tile (past 8 devices, one tile per block for all its holders; past 16 tiles, the rest named)
    held = {int(q): parse_block(r.get("data-block")) for r in rects(root, "held") for q in r.get("data-ranks").split(",")}
    more = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "more-devices"]
    assert len(held) == n or (n > 16 and len(more) == 1 and str(max(set(mesh.rank_list) - set(held))) in more[0])
    assert held == {r: sl.local_block(shape, mesh, nd, r) for r in held}
    # the distinct cells tile each slab exactly once
    cells = [parse_block(c.get("data-block")) for c in rects(root, "cell")]
    assert len(cells) == len(set(cells))
    assert sum(math.prod(e - s for s, e in b) for b in cells) == math.prod(shape)
    for c in rects(root, "cell"):
        ranks = sorted(int(r) for r in re.split("[+,]", c.get("data-holders")))
        assert ranks == sorted(r for r, b in held.items() if b == parse_block(c.get("data-block")))


def _fonts(root: ET.Element) -> list[float]:
    return [float(t.get("font-size")) for t in root.iter(f"{NS}text")]


def _label_fits(root: ET.Element) -> list[tuple[str, float, float]]:
    """Per holder label line: (text, its width at the monospace advance, the width of its cell)."""
    cells = rects(root, "cell")
    out = []
    for t in root.iter(f"{NS}text"):
        if t.get("class") != "holders":
            continue
        x, y = float(t.get("x")), float(t.get("y"))
        (cell,) = [c for c in cells if float(c.get("x")) <= x <= float(c.get("x")) + float(c.get("width"))
                   and float(c.get("y")) <= y <= float(c.get("y")) + float(c.get("height"))]
        out.append((t.text, len(t.text) * float(t.get("font-size")) * 0.62, float(cell.get("width"))))
    return out


def test_8x8_mesh_is_readable_and_grows_instead_of_shrinking_text():
    mesh = sl.Placement("cpu", torch.arange(64).reshape(8, 8).tolist(), axis_names=("dp", "tp"))
    for shape, sbp in (((64, 64), "S(0), S(1)"), ((8, 8), "B, P"), ((16, 8), "S(0), B")):
        pic = layout_picture(shape, mesh, sbp)
        root = svg_tree(pic)
        assert min(_fonts(root)) >= 9
        for text, need, room in _label_fits(root):
            assert need <= room, (sbp, text)  # every holder label inside its block
        subtitle = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "subtitle"][0]
        assert "ranks 0..63" in subtitle and "[[0, 1" not in subtitle  # 64 ranks are not written out
        assert float(root.get("width")) < 1000
    # B, P: 8 partial sums of 8 addends each: one short line per sum, not one 180-character line
    lines = [t.text for t in svg_tree(layout_picture((8, 8), mesh, "B, P")).iter(f"{NS}text")
             if t.get("class") == "holders"]
    assert lines == ["0+1+…+7,", "8+9+…+15,", "…", "56+57+…+63"]
    # 32 ranks in a row: the tensor plane widens so each block still holds its rank number
    row = sl.Placement("cpu", list(range(32)))
    wide = svg_tree(layout_picture((4, 64), row, "S(1)"))
    fits = _label_fits(wide)
    assert len(fits) == 32 and all(need <= room for _, need, room in fits)
    assert float(wide.get("width")) > 190 * 2  # grown, at 9 px and above
    assert min(_fonts(wide)) >= 9


def test_a_64_way_split_fits_a_notebook_column():
    """64 blocks in a row would need 1,200 px for their labels: a 1-D tensor's row wraps into lines (one
    scale, every label inside its block); a 2-D plane stops at a column's width and labels only the
    blocks wide enough, the others naming their holders on hover. Text stays at 9 px or more."""
    row = sl.Placement("cpu", list(range(64)))
    for shape in ((64,), (128,), (100,)):
        root = svg_tree(layout_picture(shape, row, "S(0)"))
        assert float(root.get("width")) <= 720 and min(_fonts(root)) >= 9, shape
        fits = _label_fits(root)
        assert len(fits) == 64 and all(need <= room for _, need, room in fits), shape  # every block labelled
        cells = sorted((float(c.get("y")), float(c.get("x"))) for c in rects(root, "cell"))
        assert len({y for y, _ in cells}) >= 2, shape  # wrapped into lines
        covered = sorted(parse_block(c.get("data-block"))[0] for c in rects(root, "cell"))
        assert covered[0][0] == 0 and covered[-1][1] == shape[0]
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # the lines together: the whole row
    cols = svg_tree(layout_picture((64, 64), row, "S(1)"))
    assert float(cols.get("width")) <= 720 and min(_fonts(cols)) >= 9
    assert all(need <= room for _, need, room in _label_fits(cols))  # no label spills onto a neighbour
    note = [t.text for t in cols.iter(f"{NS}text") if t.get("class") == "note"][0]
    assert "64 blocks too narrow to label" in note
    titles = [c.find(f"{NS}title").text for c in rects(cols, "cell")]
    assert titles == [str(r) for r in range(64)]  # each block's holder on hover
    rows = svg_tree(layout_picture((64, 64), row, "S(0)"))
    assert float(rows.get("width")) <= 720 and len(_label_fits(rows)) == 64  # taller, not wider


def test_shared_blocks_take_the_themes_colours():
    """A block several ranks hold is grey on the page's theme (a CSS variable, light grey without one),
    and a partial one's stripes too: no light-grey patch on the dark theme."""
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    root = svg_tree(layout_picture((8, 6), mesh, "S(0), B"))
    shared = [c for c in rects(root, "cell") if "," in c.get("data-holders")]
    assert shared and all("var(--jp-layout-color2" in c.get("style") for c in shared)
    stripes = ET.tostring(svg_tree(layout_picture((8, 6), mesh, "B, P")).find(f"{NS}defs"), encoding="unicode")
    assert "fill:var(--jp-layout-color1" in stripes and "fill:var(--jp-layout-color3" in stripes


def test_the_tensor_name_is_shown_when_it_has_one():
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    bare = layout_picture((8, 6), mesh, "S(0), B")
    assert bare.name == "" and bare.summary().startswith("f32[8@axis0,6]")
    named = layout_picture((8, 6), mesh, "S(0), B", name="w_qkv")
    title = [t.text for t in svg_tree(named).iter(f"{NS}text") if t.get("class") == "title"][0]
    assert title.startswith("w_qkv: f32[8@axis0,6]")
    x = sl.tensor(torch.randn(8, 6), placement=mesh, sbp="S(0), B", name="act")
    assert layout_picture(x).summary().startswith("act: ") and layout_picture(x, name="h").name == "h"
    small = sl.tensor(torch.randn(2, 6), placement=mesh, sbp="S(0), B", name="act2")
    with pytest.raises(LayoutError, match="^act2: dim 0"):  # errors name it too
        layout_picture(small, sbp="S(0), S(0)")
    with pytest.raises(LayoutError, match="^tensor: dim 0"):  # and say "tensor" when it has no name
        layout_picture((2, 6), mesh, "S(0), S(0)")


def test_notebook_view_never_shrinks_the_picture():
    """JupyterLab caps an SVG in HTML output at the cell's width; the picture's own style keeps it at
    its natural size (the box scrolls), so its 9 px text stays 9 px."""
    mesh = sl.Placement("cpu", torch.arange(64).reshape(8, 8).tolist())
    pic = layout_picture((64, 64), mesh, "S(0), S(1)", name="w")
    html = pic._repr_html_()
    width = float(svg_tree(pic).get("width"))
    assert f"min-width:{width:.0f}px" in html and f"max-width:{width:.0f}px" in html
    assert html.count("<svg") == 1 and "w: f32[64@axis0,64@axis1]" in html


def test_16_and_64_ranks_aggregate_devices_into_a_notebook_column():
    """Past 8 devices, devices holding the same block share one tile labelled with their ranks, the tiles
    wrap to half a notebook's width, and past 16 tiles the rest are named in a line: the picture fits a
    playground column (no sideways scrolling) at 9 px text or more."""
    mesh16 = sl.Placement("cpu", torch.arange(16).reshape(4, 4).tolist())
    root = svg_tree(layout_picture((16, 16), mesh16, "S(0), B"))
    tiles = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "rank-label"]
    assert tiles == ["ranks 0-3", "ranks 4-7", "ranks 8-11", "ranks 12-15"]  # a row of the mesh holds one block
    assert float(root.get("width")) <= 460 and min(_fonts(root)) >= 9
    every = svg_tree(layout_picture((16, 16), mesh16, "S(0), S(1)"))  # 16 blocks: 16 tiles, 4 to a row
    assert len(rects(every, "held")) == 16 and float(every.get("width")) <= 460
    mesh64 = sl.Placement("cpu", torch.arange(64).reshape(8, 8).tolist())
    big = svg_tree(layout_picture((64, 64), mesh64, "S(0), S(1)"))
    more = [t.text for t in big.iter(f"{NS}text") if t.get("class") == "more-devices"]
    assert len(rects(big, "held")) == 16 and more == ["ranks 16-63: a block each, drawn in the tensor above"]
    assert float(big.get("width")) <= 520 and min(_fonts(big)) >= 9
    four = svg_tree(layout_picture((8, 6), sl.Placement("cpu", [[0, 1], [2, 3]]), "S(0), B"))  # few: the mesh grid
    assert [t.text for t in four.iter(f"{NS}text") if t.get("class") == "rank-label"][0] == "rank 0 (0,0)"


def test_the_picture_takes_the_themes_colours_with_light_fallbacks():
    """In JupyterLab the page, tiles and text follow the theme's variables (no white card in the dark
    theme); a saved .svg file falls back to the light colours. Labels on a rank's colour stay black."""
    root = svg_tree(layout_picture((8, 6), sl.Placement("cpu", [[0, 1], [2, 3]]), "S(0), B"))
    page = rects(root, "page")[0]
    assert page.get("fill") == "#fff" and "var(--jp-layout-color0" in page.get("style")
    assert all("var(--jp-layout-color1" in t.get("style") for t in rects(root, "tile"))
    texts = list(root.iter(f"{NS}text"))
    themed = [t for t in texts if "var(--jp-content-font-color1" in (t.get("style") or "")]
    assert len(themed) == len([t for t in texts if t.get("class") != "chip-label"]) > 10
