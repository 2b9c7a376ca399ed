"""A saved notebook keeps a static rendering where each widget was: ``text/html`` beside the widget view,
of what the widget showed."""

from __future__ import annotations

import pytest

pytest.importorskip("anywidget")

from sbplab.widgets import ModelBuilder, RunPanel, SbpPlayground, SearchPanel, StrategyEditor  # noqa: E402

VIEW = "application/vnd.jupyter.widget-view+json"
MLP_SIZES = dict(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4)


def bundle(w) -> dict:
    b = w._repr_mimebundle_()
    data = b[0] if isinstance(b, tuple) else b
    assert data[VIEW]["model_id"] == w.model_id  # a live JupyterLab still draws the widget itself
    return data


def test_every_widget_carries_a_static_rendering_of_what_it_shows():
    b = ModelBuilder("mlp", **MLP_SIZES)
    html = bundle(b)["text/html"]
    assert "ModelBuilder: mlp" in html and "snapshot" in html and b.summary.splitlines()[0][:30] in html

    e = StrategyEditor(b, preset="dp", mesh="2")
    html = bundle(e)["text/html"]
    assert f"StrategyEditor: {e.strategy_name}" in html and "<svg" not in html  # a sanitizer would strip SVG
    assert "bytes sent per step" in html and html.count("<tr>") >= 3  # a row per rank

    p = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp="S(0), B", target="B, B")
    html = bundle(p)["text/html"]
    assert p.src_type in html and "all_gather" in html and "(4, 6)" in html  # rank 0's local shape

    r = RunPanel(e, steps=2, backend="in-process")
    before = bundle(r)["text/html"]
    assert "RunPanel: data parallel x2 on 2 rank(s)" in before and "parallel run" not in before
    r.run()
    after = bundle(r)["text/html"]  # displayed again after a run: the losses beside torch's
    assert "matches single-device PyTorch" in after
    assert all(f"{row['run']:.6f}" in after for row in r.loss_rows)

    s = SearchPanel(b, hardware="cpu_box", devices=2, method="cd")
    assert "not searched yet" in bundle(s)["text/html"]
    s.search()
    html = bundle(s)["text/html"]
    assert s.summary.split(":")[0] in html and all(row["strategy"] in html for row in s.rows)


def test_text_is_escaped_in_the_snapshot():
    p = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp="S(0), B", target="B, B")
    p.shape_text = "8, <b>x"
    html = bundle(p)["text/html"]
    assert p.error and "&lt;b&gt;x" in html and "<b>x" not in html
