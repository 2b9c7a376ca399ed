"""Parallelisms as rules over named mesh axes: ``sl.Strategy(sl.mesh(dp=2, tp=2), [sl.DataParallel("dp"),
sl.TensorParallel("tp")])`` compiles to exactly what the preset it spells compiles to (the presets are
such compositions), each rule reports what it did, and a rule that cannot apply says so: a warning
naming the layer and the reason, or an error when it applies nowhere."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sbplab as sl
from sbplab.models import MLP, MLPConfig


def _mlp():
    torch.manual_seed(0)
    model = MLP(MLPConfig(n_blocks=2))
    (x,), y = model.example_batch(8)
    return model, x, y


def _compile(strategy, model=None):
    m, x, y = _mlp()
    model = model or m
    return sl.compile(model, (x,), loss_fn=model.loss_fn if hasattr(model, "loss_fn") else F.cross_entropy,
                      target=y, optimizer=sl.Adam(), strategy=strategy)


def _same(a, b) -> None:
    assert a.deduction.sbp == b.deduction.sbp
    assert [(c.phase, c.kind, c.mesh_axis) for c in a.physical.collectives] == \
        [(c.phase, c.kind, c.mesh_axis) for c in b.physical.collectives]


def test_mesh_names_its_axes_with_the_last_axis_consecutive():
    m = sl.mesh(dp=2, tp=4)
    assert m.axis_names == ("dp", "tp") and m.shape == (2, 4) and m.device_type is None
    assert m.groups("tp")[0] == (0, 1, 2, 3) and m.groups("dp")[0] == (0, 4)
    with pytest.raises(sl.InputError, match="sizes must be ints >= 1"):
        sl.mesh(dp=0)


def test_rules_compose_to_the_presets():
    _same(_compile(sl.Strategy(sl.mesh(dp=2, tp=2), [sl.DataParallel("dp"), sl.TensorParallel("tp")])),
          _compile(sl.presets.dp_tp((2, 2))))
    _same(_compile(sl.Strategy(sl.mesh(dp=2), [sl.DataParallel("dp"), sl.ZeRO(3, "dp")])), _compile(sl.presets.zero(2)))
    _same(_compile(sl.Strategy(sl.mesh(dp=2), [sl.DataParallel("dp"), sl.ZeRO(2, "dp")])),
          _compile(sl.presets.zero(2, shard_params=False)))


def test_zero_levels_shard_more_state_each():
    sbp = {lvl: _compile(sl.Strategy(sl.mesh(dp=2), [sl.DataParallel(), sl.ZeRO(lvl)])).deduction.sbp
           for lvl in (1, 2, 3)}
    w, g = "blocks.0.fc1.weight", "blocks.0.fc1.weight.grad"
    state = next(n for n in sbp[1] if n.startswith(w) and n != w and n != g)  # an Adam moment
    assert sbp[1][state] == (sl.S(0),) and sbp[1][g] != (sl.S(0),) and sbp[1][w] == (sl.B,)
    assert sbp[2][g] == (sl.S(0),) and sbp[2][w] == (sl.B,)
    assert sbp[3][w] == (sl.S(0),)
    with pytest.raises(sl.InputError, match="ZeRO level must be 1"):
        sl.ZeRO(4)


def test_pipeline_rule_cuts_the_mesh_into_stages_along_its_axis():
    st = sl.Strategy(sl.mesh(pp=2, dp=2), [sl.Pipeline("pp", micro_batches=2, schedule="1f1b"), sl.DataParallel("dp")])
    assert [p.ranks for p in st.stages] == [(0, 1), (2, 3)] and st.stages[0].axis_names == ("dp",)
    assert st.micro_batches == 2 and st.schedule == "1f1b"
    c = _compile(st)
    want = _compile(sl.presets.pipeline(2, 2, ranks_per_stage=2, inner="dp"))
    assert [op.stage for op in c.graph.ops] == [op.stage for op in want.graph.ops]
    _same(c, want)
    with pytest.raises(sl.InputError, match="schedule must be one of"):
        sl.Pipeline("pp", schedule="zigzag")
    with pytest.raises(sl.InputError, match=r"Pipeline\(stages=3\) but mesh axis pp has 2 ranks"):
        sl.Strategy(sl.mesh(pp=2, dp=2), [sl.Pipeline("pp", stages=3)])


def test_an_axis_the_mesh_lacks_is_an_error_naming_the_axes():
    with pytest.raises(sl.InputError, match=r"no axis named 'tp'; axes are \['dp', 'cp'\]"):
        _compile(sl.Strategy(sl.mesh(dp=2, cp=2), [sl.TensorParallel("tp")]))
    with pytest.raises(sl.InputTypeError, match="parallelism rules"):
        sl.Strategy(sl.mesh(dp=2), ["dp"])


class _Head(nn.Module):
    """One Linear to the classes: a column layer with no row to pair with, and no vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):  # (N, 16) -> (N, 8)
        return self.fc(x)


def test_tensor_parallel_that_splits_nothing_is_an_error_and_a_preset_warns():
    x, y, head = torch.randn(8, 16), torch.randint(0, 8, (8,)), _Head()
    with pytest.raises(sl.TensorParallelError, match=r"tensor_parallel split nothing in this model.*fc: "
                                                     r"cross_entropy 'cross_entropy' cannot keep the split"):
        sl.compile(head, (x,), loss_fn=F.cross_entropy, target=y, strategy=sl.Strategy(sl.mesh(tp=2),
                                                                                     [sl.TensorParallel("tp")]))
    assert issubclass(sl.TensorParallelError, sl.SbplabError)
    with pytest.warns(sl.TensorParallelWarning, match="split nothing"):
        sl.compile(head, (x,), loss_fn=F.cross_entropy, target=y, strategy=sl.presets.tensor_parallel(2))


class _Mixed(nn.Module):
    """Two fc1 -> fc2 pairs, the second broken by a LayerNorm between its layers."""

    def __init__(self) -> None:
        super().__init__()
        self.a_fc1, self.a_fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.b_fc1, self.ln, self.b_fc2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x):  # (N, 16) -> (N, 8)
        h = self.a_fc2(torch.relu(self.a_fc1(x)))
        return self.b_fc2(self.ln(torch.relu(self.b_fc1(h))))


def test_a_layer_the_rule_cannot_split_is_named_in_a_warning():
    x, y = torch.randn(8, 16), torch.randint(0, 8, (8,))
    st = sl.Strategy(sl.mesh(tp=2), [sl.TensorParallel("tp")])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", sl.TensorParallelWarning)
        c = sl.compile(_Mixed(), (x,), loss_fn=F.cross_entropy, target=y, strategy=st)
    msgs = [str(w.message) for w in said if w.category is sl.TensorParallelWarning]
    assert len(msgs) == 1 and "left some layers whole (b_fc1: layer_norm 'ln' cannot keep the split" in msgs[0]
    assert c.deduction.sbp["a_fc1.weight"] == (sl.S(0),) and c.deduction.sbp["b_fc1.weight"] == (sl.B,)
    text = st.report.text()
    assert "TensorParallel('tp')" in text and "paired [a_fc1]" in text and "not paired [b_fc1]" in text
    r = sl.compare_with_torch(_Mixed(), (x,), target=y, loss_fn=F.cross_entropy, optimizer=sl.SGD(lr=0.1), strategy=st, steps=2)
    assert r.loss_err < 2e-5 and r.max_param_err < 2e-5


def test_the_same_rules_bind_to_any_device():
    st = sl.Strategy(sl.mesh(dp=2, tp=2), [sl.DataParallel("dp"), sl.TensorParallel("tp")])
    cpu = sl.compiler.deduction.strategy.bind_device(st, "cpu")
    assert cpu.rules == st.rules and cpu.placement.device_type == "cpu" and st.placement.device_type is None
