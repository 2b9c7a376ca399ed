"""The real thing: JupyterLab in headless Chromium, the widgets clicked like a person would.

Starts a JupyterLab server on loopback and opens notebooks that show the widgets: in the
SbpPlayground it clicks an SBP button and checks that the layout and the boxing plan change; in the
StrategyEditor it picks another preset and checks that the summary is recomputed. Both need the
kernel to recompute and send state back. Screenshots land in artifacts/browser/.
"""

from __future__ import annotations

import json
import os
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
TOKEN = "sbplab-browser-test"
SCREENSHOT_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "browser"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]



def _notebook(source: str) -> dict:
    return {
        "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": source}],
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
                     "e = StrategyEditor(m, (x,), y, m.loss_fn, preset='dp', mesh=(4,))\n"
                     "e"),
}


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
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
           "jupyterlab.NeverCheckForUpdate"]
    log = open(root / "lab.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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


@contextmanager
def notebook_page(lab_url: str, notebook: str, screenshot: str):
    """A Chromium page with ``notebook`` open in JupyterLab and every cell run.

    On leaving, the page is saved as ``screenshot`` in artifacts/browser/ (or as
    ``failure-<screenshot>`` when the block raised), and the browser is closed.
    """
    from playwright.sync_api import sync_playwright

    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            workspace = notebook.replace(".", "-")  # a workspace of its own: no tabs restored from another test
            page.goto(f"{lab_url}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={TOKEN}")
            page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   f" && window.jupyterapp.shell.currentWidget.context?.path === '{notebook}'"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
                                   timeout=90_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            yield page
        except BaseException:
            page.screenshot(path=str(SCREENSHOT_DIR / f"failure-{screenshot}"), full_page=True)
            raise
        else:
            page.screenshot(path=str(SCREENSHOT_DIR / screenshot), full_page=True)
        finally:
            browser.close()
    print(f"screenshot: {SCREENSHOT_DIR / screenshot}")


def test_playground_responds_to_clicks_in_jupyterlab(jupyter_lab):
    from playwright.sync_api import expect

    with notebook_page(jupyter_lab, "play.ipynb", "sbp_playground.png") as page:
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


def test_strategy_editor_recomputes_when_the_preset_changes(jupyter_lab):
    from playwright.sync_api import expect

    with notebook_page(jupyter_lab, "editor.ipynb", "strategy_editor.png") as page:
        summary = page.get_by_test_id("summary")
        expect(summary).to_contain_text("all_reduce", timeout=90_000)  # DP: gradient all-reduces
        dp_text = summary.inner_text()
        expect(page.get_by_test_id("memory-table")).not_to_be_empty()
        page.get_by_test_id("preset-select").select_option("tp")
        expect(summary).not_to_have_text(dp_text, timeout=60_000)
        expect(summary).to_contain_text("forward", timeout=10_000)  # Megatron: all-reduce in forward
        expect(page.get_by_test_id("error-message")).to_be_empty()
    assert (SCREENSHOT_DIR / "strategy_editor.png").stat().st_size > 10_000
