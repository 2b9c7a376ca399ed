"""SearchPanel state without a browser: typed inputs, a real search on a tiny model (against ``sl.search``
called directly), the result opened in a StrategyEditor that deduces the searched signatures and trains
like single-device PyTorch, and bad requests shown beside the last good result."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("anywidget")

import sbplab as sl  # noqa: E402
from sbplab.compiler.reference import torch_steps  # noqa: E402
from sbplab.widgets import ModelBuilder, SearchPanel, StrategyEditor  # noqa: E402
from sbplab.widgets import search_panel as search_panel_module  # noqa: E402
from sbplab.widgets._assets import asset_path  # noqa: E402
from sbplab.widgets.search_form import HARDWARE, editor_settings, parse_bytes, parse_seconds  # noqa: E402
from sbplab.widgets.widget_base import SbplabWidget  # noqa: E402

MLP_SIZES = dict(in_dim=8, width=16, hidden=32, n_blocks=2, n_classes=4)
SMALL = dict(hardware="cpu_box", devices=2, method="cd")


@pytest.fixture()
def builder():
    return ModelBuilder("mlp", **MLP_SIZES)


@pytest.fixture()
def every_progress(monkeypatch):
    """Send every progress report to the page (the panel otherwise sends a few a second)."""
    monkeypatch.setattr(search_panel_module, "PROGRESS_EVERY_S", 0.0)


def _direct(panel: SearchPanel):
    """``sl.search`` called as a user would, with what the panel's inputs stand for."""
    m = panel.model()
    return sl.search(m.module, m.inputs, loss_fn=m.loss_fn, target=m.target, optimizer=panel.optimizer_def(),
                     **panel.settings())


def _run_matches_torch(editor: StrategyEditor, steps: int = 2) -> None:
    c, m = editor.compiled, editor.model
    ex = c.executor()
    feeds = dict(zip(c.graph.inputs, [*m.inputs, m.target]))
    losses = [ex.step(feeds) for _ in range(steps)]
    ref_losses, ref_params = torch_steps(m.module, m.inputs, target=m.target, loss_fn=m.loss_fn, optimizer=editor.optimizer_def(), steps=steps)
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for name, p in ref_params.items():
        assert torch.allclose(ex.value(name), p, atol=1e-5), name


def test_inputs_are_typed_traits_checked_as_they_change(builder):
    p = SearchPanel(builder)
    assert (p.hardware, p.devices, p.memory_limit, p.method, p.time_budget) == ("h100_node", 8, "", "auto", "")
    assert set(p.hardware_names) == set(HARDWARE) == {"cpu_box", "h100_node", "h100_ib_2", "a100_node"}
    assert set(p.method_names) == {"auto", "exact", "cd", "mcmc", "exhaustive"}
    assert p.error == "" and p.status == "idle" and p.rows == [] and not p.stale
    s = p.settings()
    assert s["hardware"].name == "h100_node" and s["memory_limit"] is None and s["time_budget"] is None
    p.hardware, p.devices = "h100_ib_2", 16
    assert p.settings()["hardware"].axis_bandwidth == sl.Hardware.h100_ib(2).axis_bandwidth and p.error == ""
    p.devices = 17
    assert "17 devices do not fit h100_ib(2)" in p.error and "pick 1 to 16" in p.error
    p.devices = 8
    assert p.error == ""
    p.memory_limit = "80 XB"
    assert "memory limit '80 XB'" in p.error and "'512 MiB'" in p.error
    p.memory_limit = "512 MiB"
    assert p.error == "" and p.settings()["memory_limit"] == 512 * 2**20
    p.time_budget = "0"
    assert "more than 0 s" in p.error
    p.time_budget = "500 ms"
    assert p.error == "" and p.settings()["time_budget"] == pytest.approx(0.5)
    p.method = "genetic"
    assert "pick one of auto, exact, cd, mcmc, exhaustive" in p.error
    # the state a page gets is the traits
    state = p.get_state()
    assert state["memory_limit"] == "512 MiB" and state["hardware"] == "h100_ib_2" and state["error"] == p.error


@pytest.mark.parametrize("text,value", [("", None), ("  ", None), ("2e9", 2 * 10**9), ("80 GB", 80 * 10**9),
                                        ("1.5 KiB", 1536), ("4096", 4096), ("10 kb", 10_000)])
def test_memory_limits_read_as_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text,value", [("", None), ("5", 5.0), ("5 s", 5.0), ("250 ms", 0.25), ("2 min", 120.0)])
def test_time_budgets_read_as_seconds(text, value):
    got = parse_seconds(text)
    assert got is None if value is None else got == pytest.approx(value)


def test_a_search_shows_progress_then_what_sl_search_gives(builder, every_progress):
    p = SearchPanel(builder, **SMALL)
    seen: list[tuple[str, float, float | None, int, int]] = []
    p.observe(lambda ch: seen.append((p.phase, ch["new"], p.best_ms, p.units_done, p.units_total)), names=["progress"])
    res = p.search()
    assert p.error == "" and p.status == "done" and p.progress == 1.0 and p.version == 1 and res is p.result
    # the bar moved forward through every phase, and the best cost so far showed up while it ran
    fractions = [f for _, f, *_ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(seen) >= 8
    phases = list(dict.fromkeys(ph for ph, *_ in seen))
    assert phases[:2] == ["presets", "meshes"] and phases[-1] == "simulating" and p.phase == "done"
    during = [b for ph, _, b, *_ in seen if ph in ("meshes", "pipelines")]
    assert during and during[-1] is not None and during[-1] > 0
    assert all(d <= t for *_, d, t in seen)
    # the result is the search's own, and sl.search called directly finds the same
    direct = _direct(p)
    assert res.best.describe() == direct.best.describe()
    assert res.best.step_time == pytest.approx(direct.best.step_time, rel=1e-12)
    assert p.table_text == res.table() and p.explanation == res.explain()
    assert p.summary.startswith(res.best.describe()) and str(res.predicted) in p.summary
    # the table: the searched strategy first, then every preset, fastest first in the model that chose (a
    # preset a floor under its simulation ruled out at that floor)
    shown = lambda c: c.simulated_time if c.simulated_time is not None else c.sim_floor  # noqa: E731
    assert [r["strategy"] for r in p.rows] == [res.best.describe()] + \
        [c.describe() for c in sorted(res.presets, key=shown)]
    assert [r["searched"] for r in p.rows] == [True] + [False] * len(res.presets)
    assert p.rows[0]["ratio"] == 1.0 and all(r["ratio"] >= 1 - 1e-9 for r in p.rows)
    assert {r["model"] for r in p.rows} <= {"simulated", "simulated floor; memory analytic"} and p.rows == res.rows()
    assert p.rows[0]["ms"] == pytest.approx(res.best.simulated_time * 1e3)
    assert p.rows[0]["memory"] == res.best.simulated_memory and p.rows[0]["analytic_ms"] > 0
    assert p.result_for == "mlp on cpu_box, 2 devices, method cd, no memory limit"


def test_the_page_buttons_search_and_open(builder):
    p = SearchPanel(builder, **SMALL)
    p.open_requests += 1  # nothing to open yet: said beside the (empty) result
    assert "nothing to open yet" in p.error and p.editor is None
    p.search_requests += 1
    assert p.status == "done" and p.error == "" and p.rows
    p.open_requests += 1
    assert p.error == "" and isinstance(p.editor, StrategyEditor)
    assert p.editor_ref == f"anywidget:{p.editor.model_id}"
    p.search_requests += 1  # newer results: the editor showed the older search's strategy, so it goes
    assert p.status == "done" and p.editor_ref == "" and p.editor_note == ""


def test_opening_the_result_gives_an_editor_that_deduces_the_searched_signatures(builder):
    p = SearchPanel(builder, hardware="h100_node", devices=2, method="exact")
    res = p.search()
    assert res is not None, p.error
    ed = p.open_in_editor()
    assert isinstance(ed, StrategyEditor) and ed.error == "" and ed.compiled is not None
    assert ed.builder is builder  # it follows the same model
    got = {n: ed.compiled.deduction.choices[n].signature for n in res.best.signatures}
    assert got == res.best.signatures
    # the whole step is what sl.compile makes of the searched Strategy, and it trains like torch
    m = builder.model
    ref = sl.compile(m.module, m.inputs, loss_fn=m.loss_fn, target=m.target, optimizer=p.optimizer_def(),
                     strategy=res.strategy)
    assert {k: repr(c.signature) for k, c in ed.compiled.deduction.choices.items()} == \
        {k: repr(c.signature) for k, c in ref.deduction.choices.items()}
    assert ed.compiled.physical.comm_bytes_per_rank() == ref.physical.comm_bytes_per_rank()
    assert ed.hardware is res.hardware  # its prediction is for the machine searched for
    assert str(len(res.best.signatures)) in p.editor_note
    _run_matches_torch(ed)


def test_the_panel_opens_the_result_in_the_editor_it_was_given(builder):
    ed = StrategyEditor(builder, preset="dp", mesh=(2,), optimizer="adam", lr=0.01)
    p = SearchPanel(ed, **SMALL)
    assert p.optimizer_def() == ed.optimizer_def()  # the search builds the editor's training graph
    res = p.search()
    before = ed.version
    assert p.open_in_editor() is ed and ed.version > before and ed.error == ""
    assert {n: ed.compiled.deduction.choices[n].signature for n in res.best.signatures} == res.best.signatures
    _run_matches_torch(ed)


def test_a_pipelined_candidate_opens_with_its_stages(builder):
    """Whatever wins, every kind of candidate maps onto the editor's inputs: stages, micro-batches, ZeRO."""
    p = SearchPanel(builder, **SMALL)
    res = p.search()
    ed = StrategyEditor(builder, preset="dp", mesh=(2,))
    picks = [next(c for c in res.candidates if c.n_stages > 1), next(c for c in res.candidates if c.zero == 3)]
    for c in picks:
        s = editor_settings(c)
        ed.configure(**s.inputs())
        assert ed.error == "", (c.describe(), ed.error)
        assert ed.compiled.strategy.n_stages == c.n_stages and ed.compiled.strategy.micro_batches == c.micro_batches
        assert {n: ed.compiled.deduction.choices[n].signature for n in c.signatures} == c.signatures, c.describe()
        if c.n_stages > 1:  # every module on the stage the search cut it to
            assert {m["name"]: m["stage"] for m in ed.modules} == s.stage_of and len(set(s.stage_of.values())) > 1
        _run_matches_torch(ed)


def test_bad_requests_show_the_error_beside_the_last_good_result(builder):
    p = SearchPanel(builder, **SMALL)
    good = p.search()
    rows, table, explanation, version = p.rows, p.table_text, p.explanation, p.version
    p.memory_limit = "10 B"  # nobody fits in 10 bytes
    assert p.error == "" and p.stale  # a valid number; the table shown is for other settings
    assert p.search() is None
    assert p.status == "failed" and p.stale
    assert p.progress == 0.0 and p.units_done == 0 and p.best_ms is None  # no part-filled bar beside the failure
    assert "no strategy fits memory_limit=10 B per device" in p.error and "the least memory any strategy needs" in p.error
    need = int(re.search(r"needs is (\d+) B", p.error).group(1))
    assert need > 10
    assert (p.rows, p.table_text, p.explanation, p.version, p.result) == (rows, table, explanation, version, good)
    p.memory_limit = ""
    p.devices = 12  # no mesh of this machine has 12 devices
    assert "12 devices do not fit cpu_box" in p.error and p.stale
    assert p.search() is None and "12 devices do not fit" in p.error and p.rows == rows
    p.devices = 0
    assert p.search() is None and "devices must be at least 1" in p.error and p.rows == rows
    p.devices = 2
    assert p.error == "" and not p.stale  # back to the settings of the result shown
    p.memory_limit = str(need)  # exactly the least memory: one strategy fits
    res = p.search()
    assert res is not None and p.error == "" and not p.stale and p.version == version + 1
    assert res.best.memory <= need and "memory limit" in p.result_for


def test_bad_sources_and_optimizers_fail_when_made():
    with pytest.raises(TypeError, match="SearchPanel needs a StrategyEditor, a ModelBuilder"):
        SearchPanel("mlp")
    with pytest.raises(TypeError, match="needs an example batch"):
        SearchPanel(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="optimizer 'rmsprop'"):
        SearchPanel(ModelBuilder("mlp", **MLP_SIZES), optimizer="rmsprop")


def test_a_torch_module_is_searched_as_given():
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(**MLP_SIZES))
    (x,), y = m.example_batch(8)
    p = SearchPanel(m, (x,), target=y, loss_fn=m.loss_fn, memory_limit=1e9, **SMALL)
    assert p.memory_limit == "1000000000" and p.settings()["memory_limit"] == 10**9
    res = p.search()
    assert res is not None and p.model_name == "MLP"
    assert p.result_for.endswith("memory limit 1.0 GB/device")


def test_front_end_files_follow_the_widget_conventions():
    cls = SearchPanel
    assert issubclass(cls, SbplabWidget)
    assert cls._esm._path == asset_path("search_panel.js").resolve()
    assert cls._css._path == asset_path("search_panel.css").resolve()
    js, css = asset_path("search_panel.js").read_text(), asset_path("search_panel.css").read_text()
    assert 'model.get("_dom_js")' in js and "export default { initialize, render }" in js
    assert not re.search(r"^(?:export )?function (?:h|redrawOn|fmtBytes|onEnterOrChange)\(", js, flags=re.M)
    for tid in ("hardware-select", "devices-input", "memory-input", "method-select", "budget-input", "search-button",
                "progress", "status", "error-message", "result-table", "explanation", "open-editor", "editor-view"):
        assert f'"{tid}"' in js, tid
    assert "onEnterOrChange(devIn" in js and "onEnterOrChange(memIn" in js and "onEnterOrChange(budgetIn" in js
    for text in (js, css):  # colours only from the JupyterLab theme
        assert not re.search(r"#[0-9a-fA-F]{3,8}\b|\brgba?\(|\bhsla?\(", text)
        assert all(v.startswith("--jp-") for v in re.findall(r"var\((--[\w-]+)", text))


def test_a_finalist_spared_the_simulator_shows_its_floor_as_a_bound(builder):
    p = SearchPanel(builder, **SMALL)
    row = {"strategy": "zero-3 x2", "searched": False, "user": False, "model": "simulated floor; memory analytic",
           "ms": 1.5, "memory": 2048, "ratio": 1.25, "at_least": True, "devices": 2, "analytic_ms": 1.4,
           "simulated_ms": None}
    p.rows = [row, {**row, "strategy": "data parallel x2", "at_least": False, "ratio": 1.0}]
    html = p.static_html()
    assert "&gt;=1.5" in html and "&gt;=1.25x" in html  # the bound, marked (escaped)
    assert "data parallel x2" in html and html.count("&gt;=") == 2 and "1.00x" in html
