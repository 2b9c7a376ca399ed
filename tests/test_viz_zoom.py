"""Graph pictures fit their box and stay readable: the text floor, rank rows, parameters beside their ops."""

from __future__ import annotations

import re

import pytest

import sbplab as sl
from sbplab.errors import InputError
from sbplab.models import GPT, GPTConfig
from sbplab.viz import logical_dot, physical_dot, physical_picture
from sbplab.viz.dot import DotPicture, dot_available, render_svg
from sbplab.viz.zoom_box import svg_size, zoom_box

needs_dot = pytest.mark.skipif(not dot_available(), reason="graphviz 'dot' is not installed here")
NOTEBOOK_WIDTHS = (400, 700, 900, 1200, 2500)  # px a notebook cell may offer


@pytest.fixture(scope="module")
def gpt_2x2():
    """A 2-layer GPT compiled for DP x TP on a 2x2 mesh."""
    m = GPT(GPTConfig(n_layer=2))
    (idx,), y = m.example_batch(8)
    return sl.compile(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.dp_tp((2, 2)))


def boxes(svg: str) -> dict[str, tuple[float, float, float, float]]:
    """Graphviz SVG: each node's and cluster's title -> (x0, y0, x1, y1) of its outline."""
    out = {}
    for m in re.finditer(r'<g id="[^"]*" class="(?:node|cluster)">\s*<title>([^<]*)</title>(.*?)</g>', svg, re.S):
        nums = [float(v) for v in re.findall(r"-?\d+\.?\d*", " ".join(
            re.findall(r'(?:points|d)="([^"]*)"', m.group(2))))]
        if not nums:  # an ellipse, or a plain node that is only its text
            nums = [float(v) for v in re.findall(r'(?:c[xy]|\bx|\by)="(-?[\d.]+)"', m.group(2))]
        xs, ys = nums[0::2], nums[1::2]
        out[m.group(1).replace("&#45;", "-").replace("&gt;", ">")] = (min(xs), min(ys), max(xs), max(ys))
    return out


@needs_dot
def test_svg_size_reads_graphviz_units():
    src = 'digraph { node [fontsize=10]; edge [fontsize=9]; a -> b [label="x"]; }'
    svg = render_svg(src)
    size = svg_size(svg)
    w_pt = float(re.search(r'<svg width="([\d.]+)pt"', svg).group(1))
    assert size.view_w == pytest.approx(w_pt, abs=1) and size.natural_w_px == pytest.approx(w_pt * 4 / 3)
    assert size.min_font == 9.0  # the edge label
    with pytest.raises(InputError, match="no <svg> element"):
        svg_size("<p>hi</p>")
    with pytest.raises(InputError, match="no viewBox"):
        svg_size('<svg width="10"><text font-size="9">a</text></svg>')


@needs_dot
def test_physical_graph_of_a_2_layer_gpt_on_2x2_is_readable_at_any_width(gpt_2x2):
    c = gpt_2x2
    pic = physical_picture(c.physical, c.graph)
    html = pic._repr_html_()
    size = svg_size(pic.svg())
    lo, hi = (float(re.search(rf'data-{k}="([\d.]+)"', html).group(1)) for k in ("min-width", "natural-width"))
    assert lo == pytest.approx(size.view_w * 9 / size.min_font, abs=1)  # the width at which 9 pt labels are 9 px
    style = re.search(r'<svg[^>]*style="([^"]*)"', html).group(1)
    assert "width:100%" in style and f"min-width:{lo:.0f}px" in style and f"max-width:{hi:.0f}px" in style
    assert re.search(r'<svg[^>]*preserveAspectRatio="xMinYMin meet"', html)  # anchored at the top left
    for box in NOTEBOOK_WIDTHS:  # the computed scale never draws the smallest text under 9 px
        assert size.font_px(box, 9.0, 1.5) >= 9.0 - 1e-9
    assert size.min_font * 900 / size.view_w < 9  # fitted to a 900 px cell it would be unreadable


@needs_dot
def test_rank_clusters_wrap_into_rows(gpt_2x2):
    """Four ranks draw as two rows of two: the picture grows down, not sideways."""
    c = gpt_2x2
    dot = physical_dot(c.physical, c.graph)
    assert dot.count('style="invis"') > 0
    b = boxes(render_svg(dot))
    r = [b[f"cluster_rank{i}"] for i in range(4)]
    assert r[1][0] > r[0][2] and abs(r[1][1] - r[0][1]) < 1  # rank 1 beside rank 0, same top
    assert r[2][1] > r[0][3] and r[3][1] > r[1][3]  # ranks 2 and 3 below them (SVG y grows down)
    one_row = boxes(render_svg(physical_dot(c.physical, c.graph, columns=4)))
    assert one_row["cluster_rank3"][0] > one_row["cluster_rank2"][2]
    width = svg_size(render_svg(dot)).view_w
    assert width < svg_size(render_svg(physical_dot(c.physical, c.graph, columns=4))).view_w * 0.75
    with pytest.raises(InputError, match="columns must be >= 1"):
        physical_dot(c.physical, c.graph, columns=0)


@needs_dot
def test_parameters_sit_beside_the_op_that_reads_them(gpt_2x2):
    """A parameter shares its op's row, so a block's dozen parameters do not push it sideways."""
    g = gpt_2x2.graph
    dot = logical_dot(g)
    pairs = re.findall(r'\{rank=same; "(tensor:[^"]+)"; "(op:[^"]+)";\}', dot)
    params = {t.name for t in g.tensors.values() if t.role == "param"}
    assert {p.removeprefix("tensor:") for p, _ in pairs} == params
    for p, op in pairs:
        reader = p.removeprefix("tensor:")
        assert op.removeprefix("op:") in g.tensors[reader].consumers
    b = boxes(render_svg(dot))
    for p, op in pairs:
        assert (b[p][1] + b[p][3]) / 2 == pytest.approx((b[op][1] + b[op][3]) / 2, abs=1)


def test_zoom_box_checks_its_arguments():
    svg = '<svg width="100pt" viewBox="0 0 100 50"><text font-size="10">a</text></svg>'
    html = zoom_box(svg)
    assert 'data-min-width="90"' in html and 'data-natural-width="133"' in html  # never enlarged: its 100 pt
    assert 'data-natural-width="200"' in zoom_box(svg, grow=1.5)  # 1.5 x 133 px when asked
    assert "background:#fff" not in html and "fill:transparent" in html  # the theme's page, not a white sheet
    assert html.count("<svg") == 1 and "<script>" in html
    assert zoom_box(svg) != html  # two boxes of one picture get their own ids
    with pytest.raises(InputError, match="grow >= 1"):
        zoom_box(svg, grow=0.5)
    assert str(DotPicture("digraph {}")) == "digraph {}"
