"""StrategyEditor state without a browser: presets, signatures chosen per op, hints, stages, and the
views (physical graph, memory, communication) against the compiler's own objects."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("anywidget")

from sbplab.compiler import SGD, compile, deduce, presets  # noqa: E402
from sbplab.compiler.deduction.ranking import options  # noqa: E402
from sbplab.compiler.deduction.signature_hints import escape  # noqa: E402
from sbplab.compiler.reference import torch_steps  # noqa: E402
from sbplab.hardware import Hardware  # noqa: E402
from sbplab.sim import simulate  # noqa: E402
from sbplab.viz import physical_dot  # noqa: E402
from sbplab.widgets import ModelBuilder, StrategyEditor  # noqa: E402
from sbplab.widgets._assets import asset_path  # noqa: E402
from sbplab.widgets.strategy_form import HAND  # noqa: E402

MLP_SIZES = dict(in_dim=8, width=8, hidden=16, n_blocks=2, n_classes=4)


@pytest.fixture(scope="module")
def builder():
    return ModelBuilder("mlp", **MLP_SIZES)


def _same_deduction(a, b) -> None:
    assert {k: repr(c.signature) for k, c in a.choices.items()} == {k: repr(c.signature) for k, c in b.choices.items()}
    assert [(x.tensor, x.kind, x.src_sbp, x.dst_sbp, x.bytes) for x in a.boxings] == \
        [(x.tensor, x.kind, x.src_sbp, x.dst_sbp, x.bytes) for x in b.boxings]


def _run_matches_torch(editor: StrategyEditor, steps: int = 2) -> None:
    """The editor's compiled step, run in-process, trains exactly like single-device PyTorch."""
    c, m = editor.compiled, editor.model
    ex = c.executor()
    feeds = dict(zip(c.graph.inputs, [*m.inputs, m.target]))
    losses = [ex.step(feeds) for _ in range(steps)]
    ref_losses, ref_params = torch_steps(m.module, m.inputs, target=m.target, loss_fn=m.loss_fn, optimizer=editor.optimizer_def(), steps=steps)
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for name, p in ref_params.items():
        assert torch.allclose(ex.value(name), p, atol=1e-5), name


@pytest.mark.parametrize("preset,mesh,kw", [
    ("single", "1", {}), ("dp", "4", {}), ("dp", "2, 2", {}), ("tp", "2", {}), ("dp_tp", "2, 2", {}),
    ("zero2", "2", {}), ("zero3", "2", {}), ("dp", "2", {"micro_batches": 2}),
])
def test_presets_give_what_compile_gives(builder, preset, mesh, kw):
    e = StrategyEditor(builder, preset=preset, mesh=mesh, **kw)
    assert e.error == "" and e.version == 1
    mk = {"single": lambda: None, "dp": lambda: presets.data_parallel(presets.as_mesh(e.mesh_shape), **kw),
          "tp": lambda: presets.tensor_parallel(2), "dp_tp": lambda: presets.dp_tp((2, 2)),
          "zero2": lambda: presets.zero(2, shard_params=False), "zero3": lambda: presets.zero(2)}[preset]
    m = builder.model
    ref = compile(m.module, m.inputs, loss_fn=m.loss_fn, target=m.target, optimizer=SGD(lr=0.1), strategy=mk())
    assert e.compiled.summary() == ref.summary() == e.summary
    assert e.strategy_name == ref.strategy.name
    _same_deduction(e.compiled.deduction, ref.deduction)


def test_pipeline_stages_per_module(builder):
    e = StrategyEditor(builder, preset="pipeline", mesh="1", stages=2, micro_batches=2)
    assert e.error == "" and e.ranks == [0, 1]
    assert [m["name"] for m in e.modules] == ["proj_in", "blocks.0", "blocks.1", "head"]
    e.set_stage("blocks.1", 1)
    stages = {m["name"]: m["stage"] for m in e.modules}
    assert stages == {"proj_in": 0, "blocks.0": 0, "blocks.1": 1, "head": 1}
    assert {o["module"]: o["stage"] for o in e.ops}["blocks.1.fc2"] == 1
    _run_matches_torch(e)
    e.set_stage("head", 5)
    assert "stage_of names stage 5, but there are 2 stages" in e.error
    e.stage_of = {"blocks.1": 1, "tail": 1}
    assert "a stage is given for 'tail', which the model does not have; its modules: proj_in, blocks.0" in e.error
    e.stage_of = {}
    e.preset = "dp"
    assert e.error == "" and e.stage_of == {}


def test_choices_are_signature_hints_and_choosing_the_deduced_changes_nothing(builder):
    e = StrategyEditor(builder, preset="dp_tp", mesh="2, 2")
    c = e.compiled
    assert c.strategy.signatures == [] and c.deduction.forced == {}
    _same_deduction(c.deduction, deduce(c.graph.copy(), presets.dp_tp((2, 2))))
    for op in c.graph.ops:  # the editor's first option is deduction's pick, at the same price
        best = options(c.deduction, op.name)[0]
        assert (best.signature, best.cost) == (c.deduction.choices[op.name].signature,
                                               c.deduction.choices[op.name].cost), op.name
    before = c.deduction
    e.choices = {op.name: repr(before.choices[op.name].signature) for op in c.graph.ops}
    assert e.error == "" and set(e.compiled.deduction.forced) == set(e.choices)
    assert [(h.pattern, h.text, h.why) for h in e.compiled.strategy.signatures] == \
        [(escape(k), v, HAND) for k, v in e.choices.items()]
    _same_deduction(e.compiled.deduction, before)


def test_choosing_a_signature_by_hand_changes_the_plan_and_still_trains_right(builder):
    e = StrategyEditor(builder, preset="dp", mesh="2")
    op = "blocks.0.fc1"
    e.selected_op = op
    assert [c["signature"] for c in e.candidates] == [o.text for o in options(e.compiled.deduction, op)]
    best = e.candidates[0]
    assert best["chosen"] and best["best"] and not best["hand"]
    # the weight split by output rows: x S(0) must be gathered, so it costs bytes
    pick = next(c for c in e.candidates if c["signature"].startswith("(B), (S(0))"))
    assert pick["cost"] > 0
    before = e.compiled.summary()
    e.choose(op, pick["signature"])
    ch = e.compiled.deduction.choices[op]
    assert e.error == "" and repr(ch.signature) == pick["signature"] and ch.cost == pick["cost"]
    assert ch.reason.startswith(f"forced by signature hint '{op}' [{HAND}]; deduction would take")
    assert e.compiled.summary() != before
    row = next(r for r in e.ops if r["name"] == op)
    assert row["hand"] and row["signature"] == pick["signature"]
    assert next(c for c in e.candidates if c["signature"] == pick["signature"])["hand"]
    assert "chosen by hand" in e.explain
    _run_matches_torch(e)
    e.clear_choice(op)
    assert e.compiled.summary() == before and e.choices == {}


def test_bad_choices_are_messages_not_tracebacks(builder):
    e = StrategyEditor(builder, preset="tp", mesh="2")
    shown = (e.ops, e.graph_svg, e.memory_rows, e.summary, e.strategy_name)
    assert not e.stale and e.graph_svg
    e.choose("blocks.0.fc1", "(S(9),) -> P")
    assert "op 'blocks.0.fc1' (linear) has no signature '(S(9),) -> P'" in e.error and "valid: (B), (B)" in e.error
    # nothing compiles for these settings, but the page keeps the last valid result beside the error
    assert e.compiled is None and e.stale
    assert (e.ops, e.graph_svg, e.memory_rows, e.summary, e.strategy_name) == shown
    e.choices = {}
    assert e.error == "" and e.compiled is not None and not e.stale
    # Megatron pins fc1's weight to S(0): a signature reading it as B contradicts the preset
    e.selected_op = "blocks.0.fc1"
    assert e.candidates[0]["chosen"] and e.candidates[0]["best"] and not e.candidates[0]["blocked"]
    all_b = next(c for c in e.candidates if c["signature"].startswith("(B), (B)"))
    assert "pins 'blocks.0.fc1.weight' to (S(0))" in all_b["blocked"]
    assert all(c["blocked"] for c in e.candidates[e.candidates.index(all_b):])  # allowed ones come first
    e.choose("blocks.0.fc1", all_b["signature"])
    assert "contradicts a hint" in e.error and "Megatron column parallel" in e.error
    e.choices = {}
    e.add_hint("blocks.0.fc1.weight", "S(1)", role="param")
    assert "contradictory store hints" in e.error and "editor hint 0" in e.error
    e.remove_hint(0)
    e.add_hint("", "B")
    assert "the tensor pattern is empty" in e.error
    e.hints = [{"pattern": "*", "sbp": "B", "role": "weights"}]
    assert "role 'weights' is not one of" in e.error
    e.hints = [{"pattern": "x", "sbp": "S(7)", "role": "input"}]
    assert "tensor 'x'" in e.error
    e.hints = []
    e.choose("nope", "(B,) -> (B,)")
    assert "signatures chosen for ops that are not in the graph: nope" in e.error


def test_settings_that_make_choices_invalid_drop_them_with_a_note(builder):
    e = StrategyEditor(builder, preset="dp", mesh="2")
    e.selected_op = "blocks_0_act"
    e.choose("blocks_0_act", e.candidates[-1]["signature"])
    assert e.error == "" and e.choices
    e.configure(preset="dp_tp", mesh_text="2, 2")
    assert e.error == "" and e.choices == {} and "dropped the signature chosen for blocks_0_act" in e.note


def test_bad_settings(builder):
    e = StrategyEditor(builder, preset="dp", mesh="2")
    for traits, msg in [({"preset": "tp", "mesh_text": "2, 2"}, "runs on a 1-D mesh"),
                        ({"preset": "dp_tp", "mesh_text": "4"}, "DP x TP needs a 2-D mesh"),
                        ({"preset": "fsdp"}, "preset 'fsdp': pick one of single, dp"),
                        ({"mesh_text": "2, y"}, "'y' is not a whole number"),
                        ({"mesh_text": "8, 8, 2"}, "at most 64"),
                        ({"micro_batches": 3}, "batch size 8 does not divide into 3 micro-batches"),
                        ({"optimizer": "lion"}, "optimizer 'lion': pick one of sgd, adam"),
                        ({"lr": -1.0}, "SGD needs lr > 0"),
                        ({"preset": "pipeline", "inner": "tp", "mesh_text": "2, 2"}, "needs a 1-D mesh per stage")]:
        e.configure(**traits)
        assert msg in e.error, (traits, e.error)
        e.configure(preset="dp", mesh_text="2", micro_batches=1, optimizer="sgd", lr=0.1, inner="none")
        assert e.error == ""
    with pytest.raises(TypeError, match="configure\\(\\) takes"):
        e.configure(colour="red")


def test_views_are_the_compiled_objects(builder):
    e = StrategyEditor(builder, preset="dp_tp", mesh="2, 2")
    c = e.compiled
    assert e.memory_rows == [{"rank": r, "params": m.params, "grads": m.grads, "optimizer_state": m.optimizer_state,
                              "activations_peak": m.activations_peak, "in_flight": m.micro_batches_in_flight,
                              "peak": m.peak} for r, m in sorted(c.memory.ranks.items())]
    assert e.memory_text == c.memory.table()
    for r, m in c.memory.ranks.items():  # the stacked bar of each rank adds up to its peak
        segs = re.findall(r'data-value="([\d.]+)" x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" fill="[^"]+">'
                          rf"<title>rank {r}:", e.memory_svg)
        assert sum(float(s) for s in segs) == m.peak
    assert e.comm_bytes == {str(r): b for r, b in c.physical.comm_bytes_per_rank().items()}
    assert len(e.comm_rows) == len(c.physical.collectives)
    assert [r["kind"] for r in e.comm_rows] == [x.kind + (f"({x.reduce_op})" if x.reduce_op else "")
                                                for x in c.physical.collectives]
    assert e.dot == physical_dot(c.physical, c.graph, ranks=[0, 1, 2, 3], phases=("forward",), collapse=True,
                                 title=f"{c.strategy.name}: physical graph, ranks [0, 1, 2, 3], forward")
    assert set(e.timings_ms) >= {"deduce", "lower", "memory", "graph", "total"}


def test_graph_controls(builder):
    e = StrategyEditor(builder, preset="dp_tp", mesh="2, 2")
    v = e.version
    e.graph_ranks = "1"
    assert "cluster_rank1" in e.dot and "cluster_rank0" not in e.dot and e.version == v  # no recompute
    e.graph_ranks = "0, 9"
    assert "write 'all' or ranks among [0, 1, 2, 3]" in e.error
    e.configure(preset="dp", mesh_text="2")  # the step compiles; only the view setting is reported
    assert e.version == v + 1 and e.strategy_name == "data parallel x2" and "ranks among [0, 1]" in e.error
    e.configure(preset="dp_tp", mesh_text="2, 2")
    e.graph_ranks = "all"
    e.graph_phases = ["forward", "backward"]
    assert "all_reduce" in e.dot and e.error == ""
    e.graph_kind = "logical"
    assert e.dot.startswith('digraph "logical"') and '"box:' in e.dot
    e.graph_phases = ["sideways"]
    assert "graph phases ['sideways']" in e.error
    e.graph_phases, e.graph_kind = ["forward"], "3d"
    assert "graph kind '3d'" in e.error
    e.graph_kind = "physical"
    e.op_phase = "update"
    assert e.ops and {r["phase"] for r in e.ops} == {"update"}
    e.op_phase, e.op_filter = "forward", "fc2"
    assert [r["name"] for r in e.ops] == ["blocks.0.fc2", "blocks.1.fc2"]
    e.selected_op = "missing"
    assert "op 'missing' is not in the graph" in e.error


def test_the_graph_picture_then_the_prediction_are_sent_after_the_numbers(builder):
    e = StrategyEditor(builder, preset="dp", mesh="2")
    sent: list[set[str]] = []
    send = e.send_state
    e.send_state = lambda key=None: (sent.append(set(key or ())), send(key))[1]
    e.selected_op = "blocks.0.fc1"
    pick = next(c["signature"] for c in e.candidates if c["cost"] > 0)
    dot_before, sent[:] = e.dot, []
    e.choose("blocks.0.fc1", pick)
    assert e.error == "" and e.dot != dot_before
    numbers = next(i for i, k in enumerate(sent) if "summary" in k)
    picture = next(i for i, k in enumerate(sent) if k & {"graph_svg", "graph_text", "graph_note"})
    predicted = next(i for i, k in enumerate(sent) if "predicted" in k)
    assert numbers < picture < predicted and not sent[numbers] & {"graph_svg", "graph_text"} and {"ops", "candidates"} <= sent[numbers]
    assert not (sent[numbers] | sent[picture]) & {"predicted", "predicted_version"}
    ms = e.timings_ms
    assert ms["total"] == pytest.approx(ms["shown"] + ms["svg"] + ms["predict"], abs=0.05)
    assert ms["predict"] >= ms["plan"] and ms["predict"] >= ms["simulate"]
    v = e.version
    e.graph_kind = "logical"  # a view change draws at once and keeps the recompute's timings
    assert e.dot.startswith('digraph "logical"') and e.version == v and e.timings_ms == ms


def test_follows_the_model_builder_and_the_page():
    b = ModelBuilder("mlp", **MLP_SIZES)
    e = StrategyEditor(b, preset="dp", mesh="2")
    params = len(e.compiled.graph.params)
    b.set_size("n_blocks", 3)
    assert e.error == "" and len(e.compiled.graph.params) == params + 4
    e.selected_op = "blocks.2.fc1"
    e.choose("blocks.2.fc1", e.candidates[1]["signature"])
    assert e.error == "" and repr(e.compiled.deduction.choices["blocks.2.fc1"].signature) == e.candidates[1]["signature"]
    b.set_size("n_blocks", 2)
    assert e.error == "" and e.choices == {} and "dropped the signatures chosen for blocks.2.fc1" in e.note
    b.set_size("n_blocks", 3)
    b.set_size("n_blocks", -2)
    assert b.error and e.error == "" and len(e.compiled.graph.params) == params + 4  # keeps the last good model
    e.set_state({"preset": "zero3"})  # a click in the page arrives as set_state
    assert e.strategy_name == "ZeRO-3 x2" and "summary" in e.get_state()
    js = asset_path("strategy_editor.js").read_text()
    for tid in ("preset-select", "mesh-input", "ops-table", "signature-list", "op-explain", "physical-graph",
                "memory-chart", "comm-chart", "error-message", "hint-add", "graph-ranks", "prediction",
                "prediction-table", "auto-predict", "predict-button", "predict-error", "predict-note"):
        assert f'"{tid}"' in js
    assert "`op-row-${op.name}`" in js and "`signature-${i}`" in js
    assert ".sig-choice" in asset_path("strategy_editor.css").read_text()
    assert "button.selected" in asset_path("base.css").read_text()  # a chosen signature, as every pressed button
    with pytest.raises(TypeError, match="needs an example batch"):
        StrategyEditor(b.module)


# --- the simulator's prediction -------------------------------------------------------------------------
def _simulated(builder, strategy, hw):
    """``sl.simulate`` of the same step compiled without the editor."""
    m = builder.model
    c = compile(m.module, m.inputs, loss_fn=m.loss_fn, target=m.target, optimizer=SGD(lr=0.1), strategy=strategy)
    return simulate(c, hw)


def _shows(e: StrategyEditor, pred) -> None:
    p = e.predicted
    assert p["step_ms"] == pytest.approx(pred.step_time * 1e3, rel=1e-9) and p["hardware"] == pred.hardware.name
    assert [r["rank"] for r in p["ranks"]] == sorted(pred.peak_memory)
    for row in p["ranks"]:
        r = row["rank"]
        assert row["peak"] == pred.peak_memory[r] == sum(row["memory"].values())
        assert row["memory"] == pred.memory_breakdown[r]
        assert row["compute_ms"] + row["comm_ms"] + row["idle_ms"] == pytest.approx(p["step_ms"], rel=1e-6)


def test_the_prediction_is_the_simulators_and_follows_the_settings(builder):
    e = StrategyEditor(builder, preset="dp_tp", mesh="2, 2")
    assert e.error == "" and e.predict_error == "" and e.hardware_name == "cpu_box"
    assert e.predicted_version == e.version and e.prediction.plan is e.compiled.plan()
    _shows(e, _simulated(builder, presets.dp_tp((2, 2)), Hardware.cpu_box()))
    e.configure(preset="dp", mesh_text="2")
    _shows(e, _simulated(builder, presets.data_parallel(2), Hardware.cpu_box()))
    dp = e.predicted
    e.preset = "tp"
    assert e.predicted_version == e.version
    _shows(e, _simulated(builder, presets.tensor_parallel(2), Hardware.cpu_box()))
    # Megatron splits the blocks' weights over the 2 ranks that DP copies them to
    assert all(t["memory"]["parameters"] < d["memory"]["parameters"] for t, d in zip(e.predicted["ranks"], dp["ranks"]))
    spec = e.predicted
    h100 = Hardware.h100_node()
    v, n = e.version, e.predictions
    e.hardware = h100  # a what-if: the same step on another machine, without recompiling
    assert e.version == v and e.predictions == n + 1 and e.hardware_name == "h100_node"
    _shows(e, _simulated(builder, presets.tensor_parallel(2), h100))
    assert e.predicted["step_ms"] < spec["step_ms"] and e.predicted["ranks"][0]["peak"] == spec["ranks"][0]["peak"]
    with pytest.raises(TypeError, match="hardware must be an sl.Hardware .* got str"):
        e.hardware = "h100"
    with pytest.raises(TypeError, match="hardware must be an sl.Hardware"):
        StrategyEditor(builder, hardware=8)


def test_a_bad_setting_keeps_the_last_prediction_beside_the_error(builder):
    e = StrategyEditor(builder, preset="dp", mesh="2")
    shown, v = e.predicted, e.predicted_version
    e.mesh_text = "2, x"
    assert e.error and e.compiled is None and e.prediction is None and e.predict() is None
    assert e.predicted == shown and e.predicted_version == v  # stale, drawn as for the previous settings
    e.mesh_text = "4"
    assert e.predicted_version == e.version and len(e.predicted["ranks"]) == 4


def test_prediction_on_request_only(builder):
    e = StrategyEditor(builder, preset="dp", mesh="2", auto_predict=False)
    assert e.predicted == {} and e.prediction is None and "predict" not in e.timings_ms
    e.set_state({"predict_requests": 1})  # the page's predict button
    assert e.predicted_version == e.version and e.prediction is not None
    _shows(e, _simulated(builder, presets.data_parallel(2), Hardware.cpu_box()))
    e.preset = "zero2"
    assert e.predicted == {} and e.prediction is None  # nothing predicted for the new settings yet
    pred = e.predict()
    assert pred is e.prediction and e.predicted_version == e.version
    e.auto_predict = True
    e.preset = "dp"
    assert e.predicted_version == e.version and e.prediction.plan is e.compiled.plan()


def test_a_step_over_the_limit_is_predicted_on_request(builder):
    e = StrategyEditor(builder, preset="dp", mesh="2")
    n = len(e.compiled.physical.nodes)
    assert e.predict_note == "" and e.predicted_version == e.version and n > 10
    e.predict_limit = 10  # a limit alone changes nothing that is already predicted
    assert e.predicted_version == e.version and f"{n} op instances are more than predict_limit (10)" in e.predict_note
    e.preset = "tp"
    assert e.predicted == {} and e.prediction is None and "press predict" in e.predict_note
    assert "predict" not in e.timings_ms  # the recompute did not pay for it
    e.set_state({"predict_requests": 1})
    _shows(e, _simulated(builder, presets.tensor_parallel(2), Hardware.cpu_box()))
    e.hardware = Hardware.h100_node()  # asked for once: follows the Hardware without asking again
    _shows(e, _simulated(builder, presets.tensor_parallel(2), Hardware.h100_node()))
    e.predict_limit = 0  # no limit
    assert e.predict_note == ""
    e.preset = "dp"
    assert e.predicted_version == e.version and "predict" in e.timings_ms


class _OneLayerHead(torch.nn.Module):
    """A single Linear straight into the loss: Megatron's column/row pair has nothing to pair with."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):  # (N, 16) -> (N, 8)
        return self.fc(x)


def test_a_preset_whose_tensor_parallelism_splits_nothing_carries_a_badge(builder):
    x, y = torch.randn(8, 16), torch.randint(0, 8, (8,))
    e = StrategyEditor(_OneLayerHead(), (x,), target=y, loss_fn=torch.nn.functional.cross_entropy,
                       preset="tp", mesh="2")
    assert e.compiled is not None and e.preset_badge == "splits nothing"
    assert "split nothing" in e.note and "fc" in e.note
    e.configure(preset="dp")  # the badge belongs to the preset that earned it
    assert e.preset_badge == "" and "split nothing" not in e.note
    assert StrategyEditor(builder, preset="tp", mesh="2").preset_badge == ""  # the MLP's pairs split
