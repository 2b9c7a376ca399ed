"""The real thing: JupyterLab in headless Chromium, the widgets clicked like a person would.

Starts a JupyterLab server on loopback and opens notebooks that show the widgets: in the
SbpPlayground it clicks an SBP button and checks that the layout and the boxing plan change; in the
StrategyEditor it picks another preset and checks that the summary is recomputed, types values and
presses Enter (the summary follows; a bad value shows an error beside the last valid result). All
of it needs the kernel to recompute and send state back. Then every widget is shown in JupyterLab's
light and dark themes and each piece of text must keep a contrast ratio of at least 4.5 (WCAG AA)
against what is behind it. Screenshots land in artifacts/browser/.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
TOKEN = secrets.token_urlsafe(24)  # the test's JupyterLab (loopback only) takes a fresh token per run
SCREENSHOT_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "browser"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]



def _notebook(source: str) -> dict:
    return {
        "cells": [{"cell_type": "code", "id": "cell-0", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": source}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }


NOTEBOOKS = {
    "play.ipynb": ("from sbplab.widgets import SbpPlayground\n"
                   "w = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp='S(0), B', target='B, B')\n"
                   "w"),
    "editor.ipynb": ("import sbplab as sl\n"
                     "from sbplab.widgets import StrategyEditor\n"
                     "m = sl.models.MLP(sl.models.MLPConfig())\n"
                     "(x,), y = m.example_batch(8)\n"
                     "e = StrategyEditor(m, (x,), target=y, loss_fn=m.loss_fn, preset='dp', mesh=(4,))\n"
                     "e"),
    "search.ipynb": ("from sbplab.widgets import ModelBuilder, SearchPanel\n"
                     "b = ModelBuilder('mlp', n_blocks=1)\n"
                     "s = SearchPanel(b, hardware='cpu_box', devices=2, method='cd')\n"
                     "s"),
    "run.ipynb": ("from sbplab.widgets import ModelBuilder, RunPanel, StrategyEditor\n"
                  "e = StrategyEditor(ModelBuilder('mlp', n_blocks=1), preset='dp', mesh=(2,))\n"
                  "RunPanel(e, steps=2)"),
    "all.ipynb": ("import sbplab as sl\n"
                  "from IPython.display import display\n"
                  "from sbplab.viz import physical_picture\n"
                  "from sbplab.widgets import ModelBuilder, RunPanel, SbpPlayground, SearchPanel, StrategyEditor\n"
                  "b = ModelBuilder('mlp', n_blocks=1)\n"
                  "e = StrategyEditor(b, preset='dp_tp', mesh=(2, 2))\n"
                  "e.selected_op = e.ops[0]['name']\n"
                  "e.choose(e.ops[0]['name'], e.candidates[-1]['signature'])\n"
                  "p = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp='S(0), B', target='B, B')\n"
                  "bad = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp='S(0), B', target='B, B')\n"
                  "bad.shape_text = '8, x'\n"
                  "s = SearchPanel(b, hardware='cpu_box', devices=2, method='cd')\n"
                  "s.search()  # its table shows the searched row highlighted\n"
                  "wide = SbpPlayground(shape=(16, 16), mesh=(4, 4), sbp='S(0), S(1)', target='B, B')\n"
                  "e16 = StrategyEditor(ModelBuilder('mlp', n_blocks=1, batch=32), preset='dp', mesh=(16,))  # 16 ranks\n"
                  "display(b, e, RunPanel(e, steps=2, backend='in-process'), p, bad, s, wide, e16)\n"
                  "display(sl.timeline(sl.simulate(e.compiled, sl.Hardware.cpu_box(), steps=2)))  # a themed figure\n"
                  "physical_picture(e.compiled.physical, e.compiled.graph)  # a notebook picture beside them"),
}


def _saved_notebook() -> dict:
    """A notebook as saved after a run, its kernel long gone: each widget's output is its mime bundle
    (the widget view and the static card), unsigned, as a tutorial cloned from git is."""
    from sbplab.widgets import ModelBuilder, StrategyEditor

    return _saved_notebook_of(StrategyEditor(ModelBuilder("mlp", n_blocks=1), preset="dp", mesh=(2,)))


def _saved_with_widget_state() -> dict:
    """A notebook as ``jupyter nbconvert --execute`` (nbclient) or JupyterLab with "Save Widget State
    Automatically" saves it: the widget's output and, in the notebook's metadata, the state of its
    models (anywidget's front-end code included), which JupyterLab restores when it opens the notebook."""
    from ipywidgets.embed import dependency_state

    from sbplab.widgets import ModelBuilder, StrategyEditor

    e = StrategyEditor(ModelBuilder("mlp", n_blocks=1), preset="dp", mesh=(2,))
    nb = _saved_notebook_of(e)
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "version_major": 2, "version_minor": 0, "state": dependency_state(e, drop_defaults=False)}}
    return nb


def _saved_notebook_of(widget) -> dict:
    data, _ = widget._repr_mimebundle_()
    nb = _notebook("e")
    nb["cells"][0]["outputs"] = [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                                  "data": data}]
    nb["cells"][0]["execution_count"] = 1
    return nb


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium")
    root = tmp_path_factory.mktemp("lab")
    for name, source in NOTEBOOKS.items():
        (root / name).write_text(json.dumps(_notebook(source)))
    (root / "saved.ipynb").write_text(json.dumps(_saved_notebook()))
    import nbformat
    from nbformat.sign import NotebookNotary

    kept = nbformat.reads(json.dumps(_saved_with_widget_state()), as_version=4)
    (root / "trust").mkdir()
    notary = NotebookNotary(data_dir=str(root / "trust"))
    notary.sign(kept)  # trusted, as the notebooks a user ran are
    (root / "kept.ipynb").write_text(nbformat.writes(kept))
    assert notary.check_signature(nbformat.read(root / "kept.ipynb", as_version=4))
    port = _free_port()
    news = root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))  # no "get notified about news?" toast over the pictures
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"),  # the theme switch stays here
           "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces")}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", f"--NotebookNotary.data_dir={root / 'trust'}", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
           "jupyterlab.NeverCheckForUpdate"]
    log = open(root / "lab.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"JupyterLab did not start: {(root / 'lab.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


@pytest.fixture(scope="module")
def lab_page(jupyter_lab):
    """One Chromium page with JupyterLab loaded, shared by the tests of this file: loading JupyterLab is
    the slow part, so each test opens its notebook in this page (``notebook_page``) instead."""
    from playwright.sync_api import sync_playwright

    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{jupyter_lab}/lab/workspaces/sbplab-test?reset&token={TOKEN}")
        page.wait_for_function("window.jupyterapp && window.jupyterapp.serviceManager.isReady", timeout=90_000)
        page.wait_for_selector(".jp-DirListing-item", timeout=90_000)  # the app has laid itself out
        yield page
        browser.close()


# Close every open document without a save dialog (their kernels shut down), so the next test's
# notebook is the only one running: two CPUs run one kernel's work at a time.
CLOSE_ALL_JS = """async () => {
  const app = window.jupyterapp;
  for (const w of [...app.shell.widgets("main")]) { if (w.context) w.context.model.dirty = false; }
  await app.commands.execute("application:close-all");
  await app.serviceManager.sessions.shutdownAll();
}"""


@contextmanager
def notebook_page(page, notebook: str, screenshot: str | None, height: int = 1000, run: bool = True,
                  theme: str = "JupyterLab Light"):
    """``notebook`` open in the shared JupyterLab page (``lab_page``), in ``theme``, every cell run.

    On leaving, the page is saved as ``screenshot`` in artifacts/browser/ (or as ``failure-<notebook>.png``
    when the block raised); the next ``notebook_page`` closes the notebook.
    """
    page.set_viewport_size({"width": 1400, "height": height})
    page.evaluate(CLOSE_ALL_JS)
    set_theme(page, theme)
    try:
        # the command returns the notebook's widget, which Playwright cannot always serialize: return nothing
        page.evaluate(f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{notebook}'}})"
                      ".then(() => null)")
        page.wait_for_function("window.jupyterapp.shell.currentWidget"
                               f" && window.jupyterapp.shell.currentWidget.context?.path === '{notebook}'"
                               " && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel",
                               timeout=90_000)
        if run:
            page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.ready.then(() =>"
                          " window.jupyterapp.commands.execute('notebook:run-all-cells'))")
        yield page
    except BaseException:
        page.screenshot(path=str(SCREENSHOT_DIR / f"failure-{notebook.replace('.ipynb', '.png')}"), full_page=True)
        raise
    if screenshot is not None:
        page.screenshot(path=str(SCREENSHOT_DIR / screenshot), full_page=True)


def set_theme(page, theme: str) -> None:
    light = str(theme.endswith("Light")).lower()
    if page.evaluate("document.body.dataset.jpThemeLight") == light:
        return
    page.evaluate(f"window.jupyterapp.commands.execute('apputils:change-theme', {{theme: '{theme}'}})")
    page.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'", timeout=30_000)
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


def test_playground_responds_to_clicks_in_jupyterlab(lab_page):
    from playwright.sync_api import expect

    with notebook_page(lab_page, "play.ipynb", "sbp_playground.png") as page:
        steps = page.get_by_test_id("boxing-steps").locator("tr.boxing-step")
        expect(steps).to_have_count(1, timeout=90_000)  # (S(0), B) -> (B, B): one all-gather
        expect(steps.first).to_contain_text("all_gather")
        layout_before = page.get_by_test_id("src-layout").inner_html()
        type_before = page.get_by_test_id("src-type").inner_text()
        assert "@" in type_before and "8" in type_before

        page.get_by_test_id("src-axis1-S1").click()  # mesh axis 1: B -> S(1)

        expect(steps).to_have_count(2, timeout=30_000)  # (S(0), S(1)) -> (B, B): two all-gathers
        expect(steps.nth(1)).to_contain_text("all_gather")
        expect(page.get_by_test_id("src-type")).not_to_have_text(type_before, timeout=10_000)
        assert page.get_by_test_id("src-layout").inner_html() != layout_before
        expect(page.get_by_test_id("error-message")).to_be_empty()
        # the local shapes table now shows the checkerboard's (4, 3) shards
        expect(page.get_by_test_id("local-shapes")).to_contain_text("4, 3")
        page.get_by_test_id("boxing").scroll_into_view_if_needed()
    assert (SCREENSHOT_DIR / "sbp_playground.png").stat().st_size > 10_000


def test_strategy_editor_recomputes_when_the_preset_changes(lab_page):
    from playwright.sync_api import expect

    with notebook_page(lab_page, "editor.ipynb", "strategy_editor.png") as page:
        summary = page.get_by_test_id("summary")
        expect(summary).to_contain_text("all_reduce", timeout=90_000)  # DP: gradient all-reduces
        dp_text = summary.inner_text()
        expect(page.get_by_test_id("memory-table")).not_to_be_empty()
        page.get_by_test_id("preset-select").select_option("tp")
        expect(summary).not_to_have_text(dp_text, timeout=60_000)
        expect(summary).to_contain_text("forward", timeout=10_000)  # Megatron: all-reduce in forward
        expect(page.get_by_test_id("error-message")).to_be_empty()
    assert (SCREENSHOT_DIR / "strategy_editor.png").stat().st_size > 10_000


def test_strategy_editor_applies_typed_values_on_enter(lab_page):
    from playwright.sync_api import expect

    with notebook_page(lab_page, "editor.ipynb", "strategy_editor_enter.png") as page:
        summary, status = page.get_by_test_id("summary"), page.get_by_test_id("status")
        error = page.get_by_test_id("error-message")
        expect(summary).to_contain_text("all_reduce", timeout=90_000)
        before = summary.inner_text()
        mesh = page.get_by_test_id("mesh-input")
        mesh.fill("2")
        mesh.press("Enter")  # the field keeps the focus: only Enter can have applied it
        expect(summary).not_to_have_text(before, timeout=60_000)
        expect(status).to_contain_text("x2", timeout=10_000)
        assert page.evaluate("document.activeElement.dataset.testid") == "mesh-input"
        two = summary.inner_text()
        micro = page.get_by_test_id("micro-batches-input")
        micro.fill("2")
        micro.press("Enter")
        expect(summary).not_to_have_text(two, timeout=60_000)
        applied = summary.inner_text()
        mesh.fill("2, x")
        mesh.press("Enter")
        expect(error).to_contain_text("'x' is not a whole number", timeout=60_000)
        expect(status).to_contain_text("showing the last valid result", timeout=10_000)
        assert summary.inner_text() == applied  # the last valid result stays beside the error
        expect(page.get_by_test_id("memory-table").locator("tr")).not_to_have_count(0)
        assert page.get_by_test_id("physical-graph").inner_html() != ""


def test_search_panel_searches_and_shows_the_table(lab_page):
    from playwright.sync_api import expect

    with notebook_page(lab_page, "search.ipynb", "search_panel.png", height=1400) as page:
        button = page.get_by_test_id("search-button")
        expect(button).to_be_enabled(timeout=90_000)
        expect(page.get_by_test_id("result-table")).to_be_hidden()
        devices = page.get_by_test_id("devices-input")
        devices.fill("9")
        devices.press("Enter")  # applied at once: more devices than the machine has
        expect(page.get_by_test_id("error-message")).to_contain_text("9 devices do not fit", timeout=30_000)
        devices.fill("2")
        devices.press("Enter")
        expect(page.get_by_test_id("error-message")).to_be_hidden(timeout=30_000)
        button.click()
        rows = page.get_by_test_id("result-table").locator("tr")
        expect(rows.nth(1)).to_contain_text("searched (cd)", timeout=120_000)  # the searched strategy first
        expect(rows).to_have_count(7)  # a header, the searched strategy and the 5 presets of 2 devices
        expect(page.get_by_test_id("status")).to_contain_text("done in")
        expect(page.get_by_test_id("explanation")).to_contain_text("best preset")
        assert page.get_by_test_id("progress").evaluate("el => el.value") == 1
        page.get_by_test_id("open-editor").click()  # the result in a StrategyEditor, drawn inside the panel
        editor = page.get_by_test_id("editor-view")
        expect(editor.get_by_test_id("summary")).to_contain_text("forward", timeout=90_000)
        expect(page.get_by_test_id("editor-note")).to_contain_text("in the StrategyEditor")
        weak = [r for r in page.locator(".sbplab-sp").first.evaluate(CONTRAST_JS) if r["ratio"] < 4.5]
        assert not weak, weak[:8]
        page.get_by_test_id("editor-note").evaluate("el => el.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(SCREENSHOT_DIR / "search_panel_editor.png"))
        page.locator(".sbplab-sp").first.evaluate("el => el.scrollIntoView({block: 'start'})")  # inputs and table
    assert (SCREENSHOT_DIR / "search_panel.png").stat().st_size > 10_000


def test_run_panel_draws_the_runs_timeline_as_sl_timeline_does(lab_page):
    """A run on worker processes: the panel shows sl.timeline's plotly figure of it (one renderer), with
    its legend (waiting, collective members, step markers) and a millisecond axis, and hover works."""
    from playwright.sync_api import expect

    with notebook_page(lab_page, "run.ipynb", "run_panel_timeline.png", height=1400) as page:
        button = page.get_by_test_id("run-button")
        expect(button).to_be_enabled(timeout=90_000)
        button.click()
        expect(page.get_by_test_id("check")).to_contain_text("matches single-device PyTorch", timeout=180_000)
        plot = page.get_by_test_id("timeline").locator(".js-plotly-plot")
        expect(plot).to_be_visible(timeout=60_000)
        legend = plot.locator(".legendtext")
        expect(legend.filter(has_text="collective members")).to_have_count(1, timeout=30_000)
        expect(legend.filter(has_text="forward")).to_have_count(1)
        assert plot.locator(".xtitle, .x2title").first.text_content() == "time (ms)"  # under the memory track
        expect(legend.filter(has_text="memory, rank 1")).to_have_count(1)  # bytes held over time, per rank
        ink = page.evaluate("(() => { const d = document.createElement('div'); document.body.append(d);"
                            " d.style.color = 'var(--jp-content-font-color1)'; const c = getComputedStyle(d).color;"
                            " d.remove(); return c; })()")
        tick = plot.locator(".xtick text, .x2tick text").first.evaluate("t => getComputedStyle(t).fill")
        assert tick == ink, (tick, ink)  # the theme's text colour, not plotly's own
        steps = [t.text_content() for t in plot.locator(".annotation-text").all()]
        assert "step 0" in steps and "step 1" in steps, steps
        labels = plot.evaluate(STEP_LABELS_JS)
        assert labels["labels"] >= 2 and labels["bars"] > 10 and not labels["hits"], labels  # over no bar
        plot.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOT_DIR / "run_panel_timeline_view.png"))


def test_a_saved_notebook_shows_the_widgets_static_card(lab_page):
    """Opened again without running it, a notebook shows each widget's static card where it was, not
    its Python repr."""
    from playwright.sync_api import expect

    with notebook_page(lab_page, "saved.ipynb", "saved_notebook.png", run=False) as page:
        card = page.locator(".jp-OutputArea-output .sbplab-static")
        expect(card).to_contain_text("StrategyEditor: data parallel x2", timeout=60_000)
        expect(card).to_contain_text("a snapshot of the widget")
        expect(card.locator("tr")).to_have_count(3)  # its table: a header and a row per rank
        text = page.locator(".jp-OutputArea-output").first.inner_text()
        assert "object at 0x" not in text and "rank 0: parameters" not in text  # no repr, no spilled chart labels


def test_a_trusted_notebook_with_saved_widget_state_draws_the_widget(lab_page):
    """A trusted notebook whose widget state was saved with it (nbconvert --execute, or JupyterLab's
    "Save Widget State Automatically") draws the widget itself from that state, before any cell runs:
    no "Error displaying widget: model not found". (Without saved state JupyterLab 4 has no fallback:
    its widget renderer writes that error itself, and the bundle's other views are not consulted.)"""
    from playwright.sync_api import expect

    with notebook_page(lab_page, "kept.ipynb", "saved_notebook_state.png", run=False) as page:
        editor = page.locator(".jp-OutputArea-output .sbplab-se")
        summary, lost = editor.get_by_test_id("summary"), page.get_by_text("Error displaying widget: model not found")
        expect(summary.or_(lost)).to_be_attached(timeout=90_000)
        if lost.count():  # under load, ipywidgets can draw the output before it has restored the notebook's
            page.evaluate("window.jupyterapp.shell.currentWidget.context.revert()")  # models: drawn again, found
        expect(summary).to_contain_text("all_reduce", timeout=90_000)
        expect(editor.get_by_test_id("status")).to_contain_text("data parallel")
        assert "model not found" not in page.locator(".jp-Notebook").inner_text()
        assert page.evaluate("window.jupyterapp.shell.currentWidget.content.model.cells.get(0).trusted")


# WCAG relative luminance and contrast; colours are composited over what is behind them (alpha too)
CONTRAST_JS = """(root) => {
  const rgba = (c) => { const v = c.match(/[\\d.]+/g).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
  const over = (top, below) => [0, 1, 2].map((i) => top[i] * top[3] + below[i] * (1 - top[3])).concat([1]);
  const behind = (el) => {
    const layers = [];
    for (let n = el; n; n = n.parentElement) {
      const c = rgba(getComputedStyle(n).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    return layers.reverse().reduce((below, c) => over(c, below), [255, 255, 255, 1]);
  };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const out = [];
  for (const el of root.querySelectorAll("*")) {
    if (el.closest("svg") || el.closest("option") || el.disabled || !el.getClientRects().length) continue;
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own && !["INPUT", "SELECT"].includes(el.tagName)) continue;
    const bg = behind(el), fg = over(rgba(getComputedStyle(el).color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    out.push({ text: (el.innerText || el.value || "").slice(0, 40), tag: el.tagName, cls: el.className,
               ratio: (hi + 0.05) / (lo + 0.05), color: getComputedStyle(el).color, bg: bg.join(",") });
  }
  return out;
}"""


# the rendered size of every text a person reads: CSS pixels for HTML, font size times the SVG's scale for SVG
FONT_JS = """(root) => {
  const out = [];
  for (const el of root.querySelectorAll("*")) {
    if (el.closest("option") || !el.getClientRects().length) continue;
    if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    let px = parseFloat(getComputedStyle(el).fontSize);
    if (el instanceof SVGElement && el.getScreenCTM()) { const m = el.getScreenCTM(); px *= Math.hypot(m.a, m.b); }
    out.push({ text: el.textContent.trim().slice(0, 30), px });
  }
  return out;
}"""

# a notebook picture (sbplab.viz.zoom_box) beside the widgets: its own layout, and graphviz on the theme's page
PICTURE_JS = """() => {
  const pic = [...document.querySelectorAll(".jp-OutputArea-output .sbplab-zoom")].find((p) => !p.closest(".sbplab-widget"));
  const svg = pic.querySelector("svg"), view = pic.querySelector(".sbplab-zoom-view");
  const lum = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number).reduce((a, v) => a + v, 0) / 765;
  return { display: getComputedStyle(pic).display, svg: svg.getBoundingClientRect().width, view: view.clientWidth,
           buttons: [...pic.querySelectorAll(".sbplab-zoom-bar button")].map((b) => b.getBoundingClientRect().width),
           sheet: getComputedStyle(svg.querySelector("g.graph > polygon")).fill,
           ink: lum(getComputedStyle(svg.querySelector("g.edge path")).stroke) };
}"""


# sl.timeline's figure: plotly's own output, right after the small output carrying its stylesheet
THEMED_FIGURE = ".jp-OutputArea-child:has(.sbplab-plotly-theme) + .jp-OutputArea-child"

# every text of a themed plotly figure (sbplab.viz.plotly_theme) but its bar labels and hover boxes: its
# fill against the page behind the figure, and the figure's own background
PLOTLY_JS = """(fig) => {
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  let bg = [255, 255, 255];
  for (let n = fig; n; n = n.parentElement) {
    const c = rgb(getComputedStyle(n).backgroundColor);
    if (c.length < 4 || c[3] > 0) { bg = c; break; }
  }
  const texts = [...fig.querySelectorAll(".main-svg text")].filter((t) => !t.closest(".hoverlayer")
    && !t.classList.contains("bartext") && t.textContent.trim() && t.getClientRects().length);
  const ratio = (t) => { const [a, b] = [lum(rgb(getComputedStyle(t).fill)), lum(bg)].sort((x, y) => y - x);
    return (a + 0.05) / (b + 0.05); };
  return { paper: getComputedStyle(fig.querySelector(".main-svg")).backgroundColor, n: texts.length,
           weak: texts.filter((t) => ratio(t) < 4.5).map((t) => [t.textContent.slice(0, 20), ratio(t)]).slice(0, 5) };
}"""

# every SVG text of sbplab's own pictures (layout pictures, graphviz graphs, the widgets' charts; plotly's
# figures have PLOTLY_JS): its fill against what it is drawn on, found as a person sees it. A haloed text
# (stroke painted first) sits on its halo; otherwise on the shapes under its centre, composited from the
# bottom (the HTML behind the SVG) up, with their fill opacity; a pattern fill counts each of its colours
# (the worst one decides).
SVG_CONTRAST_JS = """(root) => {
  const rgba = (c) => { const v = (c || "").match(/[\\d.]+/g); return v && v.length >= 3
    ? [+v[0], +v[1], +v[2], v.length > 3 ? +v[3] : 1] : null; };
  const over = (top, below) => [0, 1, 2].map((i) => top[i] * top[3] + below[i] * (1 - top[3])).concat([1]);
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const ratio = (a, b) => { const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x); return (hi + 0.05) / (lo + 0.05); };
  const behind = (el) => {
    const layers = [];
    for (let n = el; n; n = n.parentElement) {
      const c = rgba(getComputedStyle(n).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    return layers.reverse().reduce((below, c) => over(c, below), [255, 255, 255, 1]);
  };
  const paint = (el, prop, opacityProp, svg) => {  // the colours a fill or stroke can show, or null
    const st = getComputedStyle(el), v = st[prop];
    if (!v || v === "none") return null;
    const op = parseFloat(st[opacityProp] || "1") * parseFloat(st.opacity || "1");
    const url = v.match(/url\\("?#([^")]+)"?\\)/);
    if (url) {
      const pat = svg.querySelector(`[id="${url[1]}"]`);
      const cs = pat ? [...pat.querySelectorAll("rect, path, polygon, circle")]
        .flatMap((p) => paint(p, "fill", "fillOpacity", svg) || []) : [];
      return cs.length ? cs.map((c) => [c[0], c[1], c[2], c[3] * op]) : null;
    }
    const c = rgba(v);
    return c && c[3] * op > 0 ? [[c[0], c[1], c[2], c[3] * op]] : null;
  };
  const out = [];
  const svgs = [...root.querySelectorAll("svg")].filter((s) => !s.closest(".js-plotly-plot") && !s.closest("svg svg")
    && s.getClientRects().length);
  for (const svg of svgs) {
    const shapes = [...svg.querySelectorAll("rect, polygon, ellipse, circle, path")]
      .filter((e) => !e.closest("pattern, defs, marker, clipPath, mask") && e.getClientRects().length)
      .map((e) => ({ e, box: e.getBoundingClientRect(), fill: paint(e, "fill", "fillOpacity", svg) }))
      .filter((x) => x.fill);
    const page = behind(svg);
    for (const t of svg.querySelectorAll("text")) {
      if (!t.textContent.trim() || !t.getClientRects().length || getComputedStyle(t).visibility === "hidden") continue;
      const ink = (paint(t, "fill", "fillOpacity", svg) || [])[0];
      if (!ink) continue;
      const st = getComputedStyle(t), halo = paint(t, "stroke", "strokeOpacity", svg);
      const r = t.getBoundingClientRect(), cx = r.left + r.width / 2, cy = r.top + r.height / 2;
      let bgs = [page];
      if (halo && st.paintOrder.startsWith("stroke") && parseFloat(st.strokeWidth) >= 2) {
        bgs = halo.map((c) => over(c, page));
      } else {
        for (const s of shapes) {
          if (s.box.left > cx || s.box.right < cx || s.box.top > cy || s.box.bottom < cy) continue;
          if (!(t.compareDocumentPosition(s.e) & Node.DOCUMENT_POSITION_PRECEDING)) continue;  // drawn over it
          const m = s.e.getScreenCTM();
          if (!m || !s.e.isPointInFill(new DOMPoint(cx, cy).matrixTransform(m.inverse()))) continue;
          bgs = bgs.flatMap((b) => s.fill.map((c) => over(c, b))).slice(0, 16);
        }
      }
      const worst = Math.min(...bgs.map((b) => ratio(over(ink, b), b)));
      out.push({ text: t.textContent.trim().slice(0, 30), ratio: worst, fill: st.fill,
                 on: bgs.map((b) => b.slice(0, 3).map(Math.round).join(",")).join(" | "),
                 pic: (svg.getAttribute("class") || svg.closest("[class]")?.getAttribute("class") || "").slice(0, 30) });
    }
  }
  return out;
}"""

# a timeline figure's step labels ("step n") against its bars: the boxes of the labels that overlap a bar
STEP_LABELS_JS = """(plot) => {
  const box = (e) => e.getBoundingClientRect();
  const bars = [...plot.querySelectorAll(".barlayer .point path")].map(box).filter((r) => r.width > 0 && r.height > 0);
  const labels = [...plot.querySelectorAll("text.annotation-text")].filter((t) => /^step \\d+$/.test(t.textContent.trim()));
  const hits = labels.filter((t) => bars.some((b) => { const r = box(t);
    return r.left < b.right && b.left < r.right && r.top < b.bottom && b.top < r.bottom; }));
  return { labels: labels.length, bars: bars.length, hits: hits.map((t) => t.textContent) };
}"""

# the widths of the 16-rank playground's two layout pictures against their columns
COLUMNS_JS = """(pg) => [...pg.querySelectorAll(".pg-layout")].map((box) => ({ box: box.clientWidth,
  content: box.scrollWidth, svg: box.querySelector("svg").getBoundingClientRect().width }))"""


def test_widgets_are_readable_in_light_and_dark_themes(lab_page):
    """Every widget, in every state the test drives (a run's results, then stale under a changed strategy,
    a search's highlighted row, an error, 16 ranks), keeps 4.5:1 contrast (SVG text against what it is
    drawn on included) and text of 9 px or more, in
    JupyterLab's light and dark themes; a notebook picture on the same page keeps its own layout; the
    timeline figure draws on the theme; 16-rank layout pictures fit their columns and the 16-rank physical
    graph draws its alike ranks once, labelled by their ranks."""
    from playwright.sync_api import expect

    with notebook_page(lab_page, "all.ipynb", None, height=1600) as page:
        expect(page.locator(".sbplab-widget")).to_have_count(8, timeout=120_000)
        editor, run = page.locator(".sbplab-se").first, page.locator(".sbplab-rp")
        expect(editor.get_by_test_id("summary")).to_contain_text("all_reduce", timeout=90_000)
        expect(page.locator(".sbplab-pg").nth(1).get_by_test_id("error-message")).to_contain_text(
            "'x' is not a whole number")
        expect(page.locator(".sbplab-sp tr.searched")).to_have_count(1, timeout=90_000)
        wide = page.locator(".sbplab-se").nth(1)  # 16 ranks: a bar per rank in both charts, the graph grouped
        expect(wide.locator("[data-testid=memory-chart] rect.seg")).not_to_have_count(0, timeout=90_000)
        expect(wide.get_by_test_id("error-message")).to_be_hidden()
        expect(wide.get_by_test_id("physical-graph")).to_contain_text("ranks 0-15 (alike)")
        run.get_by_test_id("run-button").click()  # in-process: losses beside torch's
        expect(run.get_by_test_id("check")).to_contain_text("matches single-device PyTorch", timeout=90_000)
        expect(run.get_by_test_id("stale-note")).to_be_hidden()
        editor.get_by_test_id("preset-select").select_option("dp")  # the results are now of another strategy
        expect(run.get_by_test_id("stale-note")).to_contain_text("before the strategy changed", timeout=60_000)
        expect(run.get_by_test_id("loss-table")).to_be_visible()
        plot = page.locator(f"{THEMED_FIGURE} .js-plotly-plot")  # plotly's own output, after its stylesheet
        expect(plot.locator(".main-svg .legendtext").first).to_be_visible(timeout=60_000)  # sl.timeline's figure
        for col in page.locator(".sbplab-pg").nth(2).evaluate(COLUMNS_JS):  # 16 ranks: (S(0), S(1)) -> (B, B)
            assert col["content"] <= col["box"] + 1 and col["svg"] <= col["box"] + 1, col  # no sideways scrolling
        for theme in ("JupyterLab Light", "JupyterLab Dark"):
            light = theme.endswith("Light")
            shot = f"all_widgets_{'light' if light else 'dark'}.png"
            set_theme(page, theme)
            checked, weak, small, svg_texts = 0, [], [], 0
            for root in page.locator(".sbplab-widget").all():
                for r in root.evaluate(CONTRAST_JS):
                    checked += 1
                    if r["ratio"] < 4.5:
                        weak.append(r)
                small += [f for f in root.evaluate(FONT_JS) if f["px"] < 9 - 0.01]
            # the SVG text of the widgets' pictures and charts and of the notebook picture beside them
            for root in page.locator(".jp-OutputArea-output").all():
                for r in root.evaluate(SVG_CONTRAST_JS):
                    checked, svg_texts = checked + 1, svg_texts + 1
                    if r["ratio"] < 4.5:
                        weak.append(r)
            assert checked > 100 and svg_texts > 50, (checked, svg_texts)
            assert not weak, f"{len(weak)} of {checked} texts below 4.5:1 in {theme}: {weak[:8]}"
            assert not small, f"{len(small)} texts under 9 px (16 ranks included): {small[:8]}"
            pic = page.evaluate(PICTURE_JS)
            assert pic["display"] != "flex" and all(w < 60 for w in pic["buttons"]), pic  # the widgets' CSS stays home
            assert pic["svg"] >= min(pic["view"], 300), pic
            assert pic["sheet"] in ("transparent", "rgba(0, 0, 0, 0)", "none"), pic  # no white sheet
            assert (pic["ink"] < 0.5) == light, pic  # edges in the theme's text colour
            fig = plot.evaluate(PLOTLY_JS)
            assert fig["paper"] in ("transparent", "rgba(0, 0, 0, 0)") and fig["n"] > 5, fig  # no white card
            assert not fig["weak"], (theme, fig)  # axis, legend and title text readable on the theme's page
            for cls, name in ((".sbplab-mb", "model_builder"), (".sbplab-se >> nth=0", "strategy_editor"),
                              (".sbplab-rp", "run_panel"), (".sbplab-pg >> nth=1", "sbp_playground_error"),
                              (".sbplab-sp", "search_panel_result"), (".sbplab-pg >> nth=2", "sbp_playground_16"),
                              (".sbplab-se >> nth=1", "strategy_editor_16"), (THEMED_FIGURE, "timeline")):
                page.locator(cls).evaluate("el => el.scrollIntoView({block: 'start'})")
                page.screenshot(path=str(SCREENSHOT_DIR / f"{name}_{shot.split('_')[-1]}"))
            page.screenshot(path=str(SCREENSHOT_DIR / shot), full_page=True)
    assert (SCREENSHOT_DIR / "all_widgets_dark.png").stat().st_size > 10_000
