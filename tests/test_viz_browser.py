"""Pictures measured in a real browser (Debian's Chromium through Playwright, no JupyterLab needed): the
text a person reads is never drawn under 9 px, graphs start at their box's top left, zoom works.

The pages carry JupyterLab's own rule for SVG in HTML output (``max-width: 100%; height: auto``), the
rule that shrinks a wide picture's text to fit a cell, so these measure what a notebook shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sbplab as sl
from sbplab.viz import layout_picture, physical_picture
from sbplab.viz.dot import dot_available

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not dot_available(), reason="graphviz 'dot' is not installed here")]

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
JUPYTERLAB_SVG_RULE = ".jp-RenderedHTMLCommon svg { max-width: 100%; height: auto; }"
MEASURE = """(sel) => {
  const view = document.querySelector(sel), svg = view.querySelector("svg"), box = view.getBoundingClientRect();
  const r = svg.getBoundingClientRect();
  const fonts = [...svg.querySelectorAll("text")].map((t) => parseFloat(t.getAttribute("font-size"))
    * t.getScreenCTM().a);
  const nodes = [...svg.querySelectorAll("g.node")].map((n) => n.getBoundingClientRect());
  const first = nodes.length ? nodes.reduce((a, b) => (b.top < a.top ? b : a)) : null;
  const holder = view.closest("[data-natural-width]");
  return { left: r.left - box.left + view.scrollLeft, top: r.top - box.top + view.scrollTop, width: r.width,
           height: r.height, maxH: parseFloat(getComputedStyle(view).maxHeight),
           natural: +(svg.dataset.naturalWidth || (holder && holder.dataset.naturalWidth) || 0),
           box: view.clientWidth, minFont: Math.min(...fonts), scrollLeft: view.scrollLeft,
           firstShown: !first || (first.left >= box.left - 1 && first.right <= box.left + view.clientWidth + 1) };
}"""


@pytest.fixture(scope="module")
def page():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield browser.new_page(viewport={"width": 1100, "height": 900})
        browser.close()


def notebook_cell(html: str, width: int) -> str:
    return (f"<html><head><style>body {{ margin: 0 }} {JUPYTERLAB_SVG_RULE}</style></head><body>"
            f"<div class='jp-RenderedHTMLCommon' style='width:{width}px'>{html}</div></body></html>")


def test_gpt_physical_graph_in_a_notebook_cell(page):
    from sbplab.models import GPT, GPTConfig

    m = GPT(GPTConfig(n_layer=2))
    (idx,), y = m.example_batch(8)
    c = sl.compile(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                   strategy=sl.presets.dp_tp((2, 2)))
    page.set_content(notebook_cell(physical_picture(c.physical, c.graph)._repr_html_(), 900))
    got = page.evaluate(MEASURE, ".sbplab-zoom-view")
    assert got["minFont"] >= 9 - 0.01  # the smallest label, as drawn
    assert abs(got["left"]) <= 1 and abs(got["top"]) <= 1  # the graph is anchored at the box's top left
    assert got["scrollLeft"] == 0 and got["firstShown"]  # rank 0's first node is at the top left
    assert got["width"] >= got["box"]  # and fills its width (wider: the box scrolls)
    w0 = got["width"]
    page.click("button[data-zoom=in]")
    assert page.evaluate(MEASURE, ".sbplab-zoom-view")["width"] == pytest.approx(w0 * 1.25, rel=0.01)
    page.click("button[data-zoom=fit]")
    fit = page.evaluate(MEASURE, ".sbplab-zoom-view")
    # the whole graph, both ways (text small: the person asked): no wider than the box, no taller than it grows
    assert fit["width"] <= fit["box"] + 1 and fit["height"] <= fit["maxH"] + 1
    assert fit["width"] == pytest.approx(fit["box"], abs=1) or fit["height"] == pytest.approx(fit["maxH"] - 2, abs=2)
    page.click("button[data-zoom=reset]")
    assert page.evaluate(MEASURE, ".sbplab-zoom-view")["width"] == pytest.approx(w0, abs=1)


DARK = (":root { --jp-layout-color0: rgb(17, 17, 17); --jp-layout-color1: rgb(33, 33, 33); "
        "--jp-layout-color2: rgb(66, 66, 66); --jp-content-font-color1: rgb(230, 230, 230); } "
        "body { background: rgb(17, 17, 17); }")  # JupyterLab Dark's variables that the pictures use
LAYOUT_COLOURS = """() => {
  const svg = document.querySelector("svg.sbplab-layout"), fill = (el) => getComputedStyle(el).fill;
  return { page: fill(svg.querySelector("rect.page")), tile: fill(svg.querySelector("rect.tile")),
           title: fill(svg.querySelector("text.title")), chip: [...svg.querySelectorAll("text.chip-label")].map(fill),
           shared: [...svg.querySelectorAll("rect.cell")].filter((c) => c.dataset.holders.includes(",")).map(fill) };
}"""


def test_16_and_64_rank_layout_pictures_fit_a_half_width_column(page):
    """The SbpPlayground's columns are about 500 px wide: at 16 and 64 ranks a layout picture aggregates
    its devices and fits (no sideways scrolling), with no text under 9 px."""
    import torch

    for n, shape in ((16, (4, 4)), (64, (8, 8))):
        mesh = sl.Placement("cpu", torch.arange(n).reshape(shape).tolist(), axis_names=("dp", "tp"))
        for sbp in ("S(0), S(1)", "B, P", "S(0), B"):
            pic = layout_picture((64, 64), mesh, sbp, name="w")
            page.set_content(notebook_cell(pic._repr_html_(), 540))
            got = page.evaluate(MEASURE, ".sbplab-zoom-view")
            assert got["minFont"] >= 9 - 0.01, (n, sbp)
            assert got["width"] <= got["box"] + 1, (n, sbp, got)  # fits the cell: it does not scroll sideways


def test_a_64_way_split_fits_a_notebook_column(page):
    """64 blocks in a row: the picture wraps (a 1-D tensor) or stops at a column's width (a 2-D plane)
    instead of spreading to 1,200 px; a notebook column of 760 px shows it whole, no text under 9 px."""
    row = sl.Placement("cpu", list(range(64)))
    for shape, sbp in (((64,), "S(0)"), ((128,), "S(0)"), ((64, 64), "S(1)"), ((64, 64), "S(0)")):
        page.set_content(notebook_cell(layout_picture(shape, row, sbp)._repr_html_(), 760))
        got = page.evaluate(MEASURE, ".sbplab-zoom-view")
        assert got["minFont"] >= 9 - 0.01, (shape, sbp)
        assert got["width"] <= got["box"] + 1, (shape, sbp, got)  # no sideways scrolling


def test_layout_pictures_take_the_dark_themes_colours(page):
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    html = layout_picture((8, 6), mesh, "S(0), B")._repr_html_()
    page.set_content(notebook_cell(html, 700))
    light = page.evaluate(LAYOUT_COLOURS)
    assert light["page"] == "rgb(255, 255, 255)" and light["title"] in ("rgb(34, 34, 34)", "rgb(0, 0, 0)")
    page.set_content(notebook_cell(html, 700).replace("</style>", DARK + "</style>", 1))
    dark = page.evaluate(LAYOUT_COLOURS)
    assert dark["page"] == "rgb(17, 17, 17)" and dark["tile"] == "rgb(33, 33, 33)"  # no white card
    assert dark["title"] == "rgb(230, 230, 230)"  # text in the theme's colour
    page.set_content(notebook_cell(layout_picture((8, 6), mesh, "B, S(1)")._repr_html_(), 700)
                     .replace("</style>", DARK + "</style>", 1))
    got = page.evaluate(LAYOUT_COLOURS)
    assert got["chip"] and set(got["chip"]) == {"rgb(0, 0, 0)"}  # a block's holders on their ranks' colours stay black
    assert got["shared"] and set(got["shared"]) == {"rgb(66, 66, 66)"}  # a block several hold: the theme's grey


def _settle(page) -> None:
    """Wait for the next two frames: layout and any re-render a click queued have happened."""
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


def _model_builder_page(model: str, **config) -> str:
    """The ModelBuilder's front end with its Python state, over a stand-in for anywidget's model."""
    from sbplab.widgets.model_builder import ModelBuilder

    w = ModelBuilder(model, **config)
    state = {k: getattr(w, k) for k in w.keys}
    state = {k: v for k, v in state.items() if isinstance(v, (str, int, float, bool, list, dict, type(None)))}
    js = (ROOT / "widgets" / "model_builder.js").read_text()
    css = (ROOT / "widgets" / "base.css").read_text() + (ROOT / "widgets" / "model_builder.css").read_text()
    return f"""<html><head><style>body {{ margin: 0; width: 900px }} {css}</style></head><body>
<div id="out"></div><script type="module">
const state = {json.dumps(state)};
const model = {{ get: (k) => state[k], set: (k, v) => {{ state[k] = v; }}, save_changes() {{}}, on() {{}}, off() {{}} }};
const url = URL.createObjectURL(new Blob([{json.dumps(js)}], {{ type: "text/javascript" }}));
const mod = (await import(url)).default;
await mod.initialize({{ model }});
mod.render({{ model, el: document.getElementById("out") }});
window.rendered = true;
</script></body></html>"""


def test_model_builder_graph_starts_top_left_and_fills_its_box(page):
    for model, config in (("gpt", {"n_layer": 2}), ("mlp", {"n_blocks": 1})):
        page.set_content(_model_builder_page(model, **config))
        page.wait_for_function("window.rendered === true")
        _settle(page)
        got = page.evaluate(MEASURE, "[data-testid=logical-graph]")
        assert abs(got["left"]) <= 1 and abs(got["top"]) <= 1, model  # anchored at the box's top left
        # fills the box's width, unless that would enlarge it: a small graph opens at its own size
        assert got["width"] >= min(got["box"], got["natural"]) - 1 and got["width"] <= max(got["box"], got["natural"]) + 1
        assert got["minFont"] >= 9 - 0.01, model
        assert got["firstShown"], model  # the graph's first node is in view, not a blank corner
        w0 = got["width"]
        page.click("[data-testid=zoom-in]")
        _settle(page)
        assert page.evaluate(MEASURE, "[data-testid=logical-graph]")["width"] == pytest.approx(w0 * 1.25, rel=0.01)
        page.click("[data-testid=zoom-reset]")
        _settle(page)
        assert page.evaluate(MEASURE, "[data-testid=logical-graph]")["width"] == pytest.approx(w0, abs=1)


def test_a_widget_and_a_notebook_picture_on_one_page(page):
    """The widgets' stylesheet reaches nothing outside a widget: a notebook picture beside a widget keeps
    its own zoom bar and width. Graphviz draws on the page's colours (no white sheet in a dark theme)."""
    from sbplab.models import MLP, MLPConfig

    m = MLP(MLPConfig(n_blocks=1))
    (x,), y = m.example_batch(8)
    c = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=sl.presets.dp_tp((2, 2)))
    css = (ROOT / "widgets" / "base.css").read_text()
    widget = ('<div class="sbplab-widget"><div class="sbplab-zoombar" data-testid="graph-zoom">'
              '<button>+</button><button>fit</button></div></div>')
    dark = ":root { --jp-content-font-color1: rgb(230, 230, 230); } body { background: rgb(17, 17, 17); }"
    page.set_content(f"<html><head><style>body {{ margin: 0 }} {JUPYTERLAB_SVG_RULE} {css} {dark}</style></head>"
                     f"<body><div class='jp-RenderedHTMLCommon' style='width:900px'>{widget}"
                     f"{physical_picture(c.physical, c.graph)._repr_html_()}</div></body></html>")
    got = page.evaluate("""() => {
      const pic = document.querySelector(".sbplab-zoom"), bar = pic.querySelector(".sbplab-zoom-bar");
      const poly = pic.querySelector("svg g.graph > polygon"), edge = pic.querySelector("g.edge path");
      return { display: getComputedStyle(pic).display, buttons: [...bar.querySelectorAll("button")].map(
                 (b) => b.getBoundingClientRect().width), svg: pic.querySelector("svg").getBoundingClientRect().width,
               view: pic.querySelector(".sbplab-zoom-view").clientWidth, bg: getComputedStyle(poly).fill,
               edge: getComputedStyle(edge).stroke,
               widgetBar: getComputedStyle(document.querySelector(".sbplab-zoombar")).display };
    }""")
    assert got["display"] != "flex" and got["widgetBar"] == "flex"  # each styled by its own rules
    assert all(w < 60 for w in got["buttons"])  # the picture's buttons stay buttons, not 640-px bars
    assert got["svg"] >= min(got["view"], 300)  # and its graph is not squeezed beside them
    assert got["bg"] in ("transparent", "rgba(0, 0, 0, 0)", "none")  # no white sheet under the graph
    assert got["edge"] == "rgb(230, 230, 230)"  # edges in the page's text colour (here a dark theme's)
