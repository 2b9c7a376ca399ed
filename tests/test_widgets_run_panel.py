"""RunPanel state without a browser: a run in-process (fast) and one on real worker processes
(``multiprocess``), each checked against single-device PyTorch computed here independently."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

pytest.importorskip("anywidget")

from sbplab.compiler import compile, presets  # noqa: E402
from sbplab.compiler.reference import torch_steps  # noqa: E402
from sbplab.hardware import Hardware  # noqa: E402
from sbplab.sim import simulate  # noqa: E402
from sbplab.viz import timeline, timeline_bars  # noqa: E402
from sbplab.viz.plotly_theme import outputs  # noqa: E402
from sbplab.widgets import ModelBuilder, RunPanel, StrategyEditor  # noqa: E402
from sbplab.widgets._assets import asset_path  # noqa: E402
from sbplab.widgets.prediction_view import measured_state  # noqa: E402
from sbplab.widgets.run_check import NumericCheck, check_against_torch  # noqa: E402

MLP_SIZES = dict(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4)


@pytest.fixture()
def editor():
    return StrategyEditor(ModelBuilder("mlp", **MLP_SIZES), preset="dp", mesh="2", optimizer="sgd", momentum=0.9)


def _reference(editor: StrategyEditor, steps: int):
    m = editor.model
    return torch_steps(m.module, m.inputs, target=m.target, loss_fn=m.loss_fn, optimizer=editor.optimizer_def(), steps=steps)


def _watch_running(p: RunPanel) -> list[tuple[float, int, list]]:
    """(progress, steps done, losses so far) at every progress change while the panel says "running"."""
    seen: list[tuple[float, int, list]] = []
    p.observe(lambda ch: seen.append((ch["new"], p.steps_done, list(p.run_losses))) if p.status == "running" else None,
              names=["progress"])
    return seen


def test_in_process_run_shows_losses_side_by_side(editor):
    p = RunPanel(editor, steps=3, backend="in-process")
    assert p.strategy_name == "data parallel x2" and p.ranks == 2 and p.status == "idle"
    seen = _watch_running(p)
    p.run()
    assert p.error == "" and p.status == "done" and p.progress == 1.0
    c, m = editor.compiled, editor.model
    ex = c.executor()
    feeds = dict(zip(c.graph.inputs, [*m.inputs, m.target]))
    run_losses = [ex.step(feeds) for _ in range(3)]
    ref_losses, _ = _reference(editor, 3)
    assert [r["run"] for r in p.loss_rows] == run_losses
    # the bar moved once per step, each time with that step's loss already shown
    assert seen == [(0.3, 0, [])] + [(pytest.approx(0.3 + 0.55 * (s + 1) / 3), s + 1, run_losses[:s + 1])
                                     for s in range(3)]
    assert p.steps_done == 3 and p.run_losses == run_losses
    assert [r["torch"] for r in p.loss_rows] == ref_losses
    assert p.loss_diff == max(abs(a - b) for a, b in zip(run_losses, ref_losses)) <= p.tol
    assert p.passed and p.param_diff <= p.tol and p.worst_param in dict(m.module.named_parameters())
    assert set(p.stage_ms) == {"lowering", "running", "checking against torch"}
    assert "keeps no trace" in p.note and p.timeline_ref == "" and p.result is None
    with pytest.raises(ValueError, match="run on workers first"):
        p.timeline_figure()


def test_the_check_fails_when_a_parameter_is_off(editor):
    c, m = editor.compiled, editor.model
    ex = c.executor()
    feeds = dict(zip(c.graph.inputs, [*m.inputs, m.target]))
    losses = [ex.step(feeds) for _ in range(2)]
    params = ex.params()
    ok = check_against_torch(m, editor.optimizer_def(), losses, params)
    assert ok.passed(1e-5)
    params["head.bias"] = params["head.bias"] + torch.tensor([0, 0, 3e-3, 0])
    bad = check_against_torch(m, editor.optimizer_def(), losses, params)
    assert not bad.passed(1e-4) and bad.worst_param == "head.bias"
    assert bad.max_param_diff == pytest.approx(3e-3, rel=1e-3) and bad.loss_diff == ok.loss_diff
    with pytest.raises(ValueError, match="did not give back parameters head.weight"):
        check_against_torch(m, editor.optimizer_def(), losses, {k: v for k, v in params.items() if k != "head.weight"})
    with pytest.raises(ValueError, match="the run has 1 losses but the reference 2"):
        NumericCheck([1.0], [1.0, 2.0], {})


def test_bad_runs_are_messages(editor):
    p = RunPanel(editor, backend="in-process")
    p.steps = 0
    p.run()
    assert p.status == "failed" and p.error == "steps must be >= 1, got 0"
    p.steps, p.backend = 2, "gpu-farm"
    p.run()
    assert p.error == "backend 'gpu-farm': pick one of workers, in-process"
    p.backend = "in-process"
    editor.mesh_text = "2, x"
    assert p.strategy_name == "" and "the strategy has an error" in p.note and not p.stale  # nothing ran yet
    p.run()
    assert p.status == "failed" and "the strategy has an error, nothing to run" in p.error and "'x'" in p.error
    editor.mesh_text = "4"
    assert p.strategy_name == "data parallel x4" and p.ranks == 4
    p.set_state({"run_requests": 1})  # the page's run button
    assert p.status == "done" and p.passed and p.error == "" and p.ran_for == "data parallel x4 on 4 rank(s)"
    editor.preset = "zero3"
    assert p.stale and p.strategy_name == "ZeRO-3 x4"
    assert p.ran_for == "data parallel x4 on 4 rank(s)" and p.loss_rows  # the page names what the results are of
    editor.mesh_text = "4, x"
    assert p.stale and p.strategy_name == ""  # an editor in error: the results are not of what it shows either
    editor.mesh_text = "4"
    with pytest.raises(TypeError, match="needs a StrategyEditor or a Compiled"):
        RunPanel("dp")
    with pytest.raises(TypeError, match="needs the BuiltModel and the optimizer"):
        RunPanel(editor.compiled)


def test_a_compiled_step_can_be_run_without_an_editor(editor):
    p = RunPanel(editor.compiled, editor.model, editor.optimizer_def(), steps=2, backend="in-process")
    p.run()
    assert p.passed and [r["torch"] for r in p.loss_rows] == _reference(editor, 2)[0]


def _simulated(editor: StrategyEditor, strategy, hw: Hardware):
    """``sl.simulate`` of the editor's model under ``strategy``, compiled without the editor."""
    m = editor.model
    c = compile(m.module, m.inputs, loss_fn=m.loss_fn, target=m.target, optimizer=editor.optimizer_def(),
                strategy=strategy)
    return simulate(c, hw)


def _shows(p: RunPanel, pred) -> None:
    assert p.predicted["step_ms"] == pytest.approx(pred.step_time * 1e3, rel=1e-9)
    assert p.predicted["hardware"] == p.hardware_name == pred.hardware.name
    assert {r["rank"]: r["peak"] for r in p.predicted["ranks"]} == pred.peak_memory


def test_the_prediction_is_shown_before_a_run(editor):
    p = RunPanel(editor, backend="in-process")
    assert p.prediction is editor.prediction and p.hardware is editor.hardware  # taken, not simulated again
    _shows(p, _simulated(editor, presets.data_parallel(2), Hardware.cpu_box()))
    editor.preset = "tp"
    assert p.prediction is editor.prediction and p.predicted == editor.predicted
    _shows(p, _simulated(editor, presets.tensor_parallel(2), Hardware.cpu_box()))
    h100 = Hardware.h100_node()
    editor.hardware = h100  # a panel without a Hardware of its own follows the editor's
    _shows(p, _simulated(editor, presets.tensor_parallel(2), h100))
    assert p.prediction is editor.prediction
    mine = RunPanel(editor, backend="in-process", hardware=Hardware.a100_node())
    _shows(mine, _simulated(editor, presets.tensor_parallel(2), Hardware.a100_node()))
    editor.preset = "dp"
    _shows(mine, _simulated(editor, presets.data_parallel(2), Hardware.a100_node()))
    assert mine.prediction is not editor.prediction and mine.prediction.plan is editor.compiled.plan()
    mine.run()
    assert mine.passed and mine.measured == {} and "keeps no trace" in mine.note  # nothing measured in-process
    mine.hardware = None  # back to the editor's
    assert mine.prediction is editor.prediction and mine.hardware_name == "h100_node"
    with pytest.raises(TypeError, match="hardware must be an sl.Hardware .* got str"):
        RunPanel(editor, hardware="cpu")


def test_without_the_editors_prediction_the_run_predicts(editor):
    editor.auto_predict = False
    p = RunPanel(editor, backend="in-process")  # made now: it simulates on its own
    _shows(p, _simulated(editor, presets.data_parallel(2), Hardware.cpu_box()))
    editor.preset = "zero2"
    assert p.predicted == {} and p.prediction is None and editor.prediction is None
    p.run()
    assert p.passed
    _shows(p, _simulated(editor, presets.zero(2, shard_params=False), Hardware.cpu_box()))
    c = editor.compiled
    q = RunPanel(c, editor.model, editor.optimizer_def(), backend="in-process", hardware=Hardware.h100_node())
    _shows(q, simulate(c, Hardware.h100_node()))


def test_page_state_and_testids():
    js = asset_path("run_panel.js").read_text()
    for tid in ("steps-input", "backend-select", "run-button", "progress", "status", "loss-table", "timeline",
                "check", "error-message", "prediction", "prediction-table", "predict-error", "measured",
                "compare-table", "stale-note", "results"):
        assert f'"{tid}"' in js
    assert ".rp-verdict.ok" in asset_path("run_panel.css").read_text()


@pytest.mark.multiprocess
def test_workers_run_then_timeline_and_check(editor):
    p = RunPanel(editor, steps=2)
    seen = _watch_running(p)
    try:
        p.run()
        assert p.error == "" and p.status == "done" and p.passed
        # progress moved per step as the workers reported them, with the run's own losses
        losses = p.result.losses
        assert seen == [(0.3, 0, [])] + [(pytest.approx(0.3 + 0.55 * (s + 1) / 2), s + 1, losses[:s + 1])
                                         for s in range(2)]
        assert p.run_losses == losses and p.steps_done == 2
        ref_losses, ref_params = _reference(editor, 2)
        assert [r["torch"] for r in p.loss_rows] == ref_losses
        assert p.result.losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
        for name, value in ref_params.items():
            assert torch.allclose(p.result.params[name].full(), value, atol=1e-5), name
        # the measured step time beside the prediction of exactly the plan that ran
        steps = p.result.step_times
        assert p.prediction.plan is editor.compiled.plan()
        assert p.measured["steps_ms"] == pytest.approx([s * 1e3 for s in steps]) and len(steps) == 2
        assert p.measured["step_ms"] == pytest.approx(steps[1] * 1e3)  # the median of the steps after the first
        assert p.measured["predicted_ms"] == pytest.approx(p.predicted["step_ms"])
        assert p.measured["error"] == pytest.approx(p.prediction.step_time / steps[1] - 1)
        assert p.compare_text.startswith("step time: predicted")
        assert p.measured["comparable"] and p.measured["ran_on"] == "CPU workers"  # cpu_box models CPU ranks
        # a prediction for another machine (an H100 node) beside this CPU run: said so, no error figure
        h100 = simulate(editor.compiled, Hardware.h100_node())
        other, table = measured_state(h100, p.result, p.cluster.device_type)
        assert not other["comparable"] and other["error"] is None and table == ""
        assert "h100_node models a GPU per rank" in other["why"] and other["step_ms"] == p.measured["step_ms"]

        def firings(trace):  # the prediction simulates 3 steps: the run's 2 have the same firings
            return Counter((e.rank, e.actor, e.lane, e.step, e.micro) for e in trace.events if e.step < 2)

        assert firings(p.prediction.trace) == firings(p.result.trace)
        bars = timeline_bars(p.result.trace)
        assert {b.rank for b in bars} == {0, 1} and "starting workers" in p.stage_ms
        # the page draws sl.timeline's own outputs of the run (one renderer) in an Output widget: the theme's
        # stylesheet, then plotly's bundle of the figure, every firing in it
        fw, out = p.timeline_fig, p.timeline_output
        assert p.timeline_ref == out.model_id and tuple(out.outputs) == outputs(fw)
        assert len(json.dumps(out.get_state())) < 1_000_000  # the figure's JSON, no plotly.js
        firings = [tr for tr in fw.data if tr.meta == "firings"]
        assert p.firings == len(bars) == sum(len(tr.x) for tr in firings) > 0
        want = timeline(p.result, compiled=editor.compiled)
        assert [(tr.name, tr.meta, len(tr.x if tr.x is not None else ())) for tr in fw.data] == \
            [(tr.name, tr.meta, len(tr.x if tr.x is not None else ())) for tr in want.data]
        assert any(a.text == "step 1" for a in fw.layout.annotations)  # step markers: every step run
        coll = [h for tr in firings if tr.name.startswith("collectives") for h in tr.hovertext]
        assert coll and all(" of " in h.split("<br>")[0] and "(before -> after)" in h for h in coll)
        pids = p.cluster.pids
        editor.preset = "tp"  # another strategy on the same two workers
        assert p.stale
        p.run()
        assert p.passed and not p.stale and p.cluster.pids == pids and "starting workers" not in p.stage_ms
        assert p.measured["predicted_ms"] == pytest.approx(editor.predicted["step_ms"])  # tp's, not dp's
        assert p.timeline_figure().data and p.timeline_fig is not fw  # tp's run, a figure of its own
        assert p.timeline_output is out and tuple(out.outputs) == outputs(p.timeline_fig)  # shown in its place
    finally:
        p.close()
    assert p.cluster is None and p.timeline_output is None and out.comm is None


def test_a_step_too_big_for_the_editor_is_predicted_when_it_runs(editor):
    editor.predict_limit = 10  # far fewer op instances than the step has
    editor.preset = "tp"
    assert editor.predicted == {} and "press predict" in editor.predict_note
    p = RunPanel(editor, backend="in-process")
    assert p.predicted == {} and p.prediction is None  # not paid for on construction either
    p.run()
    assert p.passed
    _shows(p, _simulated(editor, presets.tensor_parallel(2), Hardware.cpu_box()))
    editor.predict()  # the editor's predict button: the panel takes that prediction
    assert editor.prediction is not None and p.predicted == editor.predicted


def test_a_closed_panel_stops_following_the_editor(editor):
    p = RunPanel(editor, backend="in-process", hardware=Hardware.h100_node())
    shown = p.predicted
    p.close()
    editor.preset = "tp"  # the editor predicts tp; a closed panel neither simulates it nor shows it
    assert editor.predicted_version == editor.version and p.predicted == shown and p.strategy_name == "data parallel x2"
