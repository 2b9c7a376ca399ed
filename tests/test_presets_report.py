"""Presets pair only real Megatron pairs and say what they did; hints that match nothing are errors.

The LayerNorm case is the one a user met: with a LayerNorm between fc1 and fc2, pairing them by name
split the LayerNorm's input and cost all-to-alls and reduce-scatters every step. Now the pair is
refused (the registry has no LayerNorm signature that keeps the feature split) and the step has only
the data-parallel all-reduces; training still matches plain PyTorch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from sbplab.compiler import SGD, HintError, Strategy, compile, presets
from sbplab.compiler.deduction.presets import as_mesh
from sbplab.compiler.reference import compare
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig
from sbplab.sbp import B, S


class NormedMLP(nn.Module):
    """fc1 -> relu -> [LayerNorm, residual add, softmax or nothing] -> fc2 -> head."""

    def __init__(self, between: str = "ln", width: int = 32) -> None:
        super().__init__()
        self.between = between
        self.proj_in = nn.Linear(16, width)
        self.pre = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.ln = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, width)
        self.head = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, 16) -> (N, 8)
        h = self.proj_in(x)
        a = torch.relu(self.fc1(self.pre(h)))
        if self.between == "ln":
            a = self.ln(a)
        elif self.between == "residual":
            a = a + h
        elif self.between == "softmax":
            a = torch.softmax(a, dim=-1)
        return self.head(h + self.fc2(a))


def _batch(n: int = 8):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, 16, generator=g),), torch.randint(0, 8, (n,), generator=g)


def _compile(model, strategy):
    xs, y = _batch()
    return compile(model, xs, loss_fn=F.cross_entropy, target=y, optimizer=SGD(lr=0.1), strategy=strategy)


def _dp_on_axis_0() -> Strategy:
    return Strategy(as_mesh((2, 2)), name="dp on axis 0").hint("*", (S(0), B), "batch", role="input")


def test_layernorm_between_breaks_the_pair_and_the_step_keeps_only_dp_all_reduces():
    torch.manual_seed(0)
    model = NormedMLP("ln")
    c = _compile(model, presets.dp_tp((2, 2)))
    phys, g = c.physical, c.graph
    # replicated over tp: one all-reduce per gradient per dp group (2 groups), nothing else
    assert len(phys.collectives) == 2 * len(g.params) == _compile(model, _dp_on_axis_0()).physical.count()
    assert {(col.kind, col.mesh_axis, col.phase) for col in phys.collectives} == {("all_reduce", 0, "backward")}
    assert c.deduction.sbp["fc1.weight"] == (B, B) and c.deduction.sbp["fc2.weight"] == (B, B)
    text = c.strategy.report.text()
    assert "not paired [fc1]" in text and "layer_norm 'ln' cannot keep the split" in text
    assert "row candidate fc2 left replicated" in text
    xs, y = _batch()
    r = compare(model, xs, target=y, loss_fn=F.cross_entropy, optimizer=SGD(lr=0.1), strategy=presets.dp_tp((2, 2)), steps=3)
    assert r.loss_err < 2e-5 and r.max_param_err < 2e-5, r


def test_a_true_pair_keeps_megatron_one_all_reduce_forward_per_dp_group():
    c = _compile(NormedMLP("none"), presets.dp_tp((2, 2)))
    assert c.deduction.sbp["fc1.weight"] == (B, S(0)) and c.deduction.sbp["fc2.weight"] == (B, S(1))
    fwd = [col for col in c.physical.collectives if col.phase == "forward"]
    assert [(col.kind, col.mesh_axis) for col in fwd] == [("all_reduce", 1)] * 2  # Megatron's g, per dp group
    assert "paired [fc1] -> relu (relu: S(1) -> S(1)) -> [fc2]" in c.strategy.report.text()


@pytest.mark.parametrize("between, culprit", [("residual", "add 'add'"), ("softmax", "softmax 'softmax'")])
def test_residual_add_and_softmax_break_the_pair_too(between, culprit):
    c = _compile(NormedMLP(between), presets.tensor_parallel(2))
    assert c.deduction.sbp["fc1.weight"] == (B,) and c.deduction.sbp["fc2.weight"] == (B,)
    assert f"{culprit} cannot keep the split" in c.strategy.report.text()


def test_zoo_models_keep_their_pairs_and_explain_them():
    text = presets.tensor_parallel(4).explain(GPT(GPTConfig(n_layer=1)))
    assert "paired [blocks.0.attn.q, blocks.0.attn.k, blocks.0.attn.v] -> " in text
    assert "-> [blocks.0.attn.proj]: every op in between keeps the split" in text
    assert "paired [blocks.0.mlp.fc1] -> blocks_0_mlp_act (gelu: S(2) -> S(2)) -> [blocks.0.mlp.fc2]" in text
    assert "not paired" not in text
    text = presets.tensor_parallel(4).explain(MLP(MLPConfig(n_blocks=2)))
    assert text.count("\n    paired [blocks.") == 2
    assert "store hint '*fc1.weight' (params) [Megatron column parallel] -> (S(0)): matched blocks.0.fc1.weight, " \
           "blocks.1.fc1.weight" in text


def test_a_misspelt_hint_is_an_error_with_close_names():
    with pytest.raises(HintError, match=r"store hint 'head\.wieght' \(params\).*matches no param tensor.*"
                                        r"close names: \['head\.weight'"):
        _compile(NormedMLP(), Strategy(as_mesh(2)).hint("head.wieght", "S(0)", "typo", role="param"))
    with pytest.raises(HintError, match=r"it would match x \(input\): drop role='param'"):
        _compile(NormedMLP(), Strategy(as_mesh(2)).hint("x", "S(0)", role="param"))
    with pytest.raises(HintError, match=r"gradient of input 0 of ops 'fc_1'.*matches no forward op.*'fc1'"):
        _compile(NormedMLP(), Strategy(as_mesh(2)).hint_input_grad("fc_1", 0, "B"))
    st = Strategy(as_mesh(2)).hint("head.wieght", "S(0)", role="param")
    assert "matched nothing" in st.explain(NormedMLP(), *_batch()[:1], F.cross_entropy, _batch()[1])


def test_a_users_own_megatron_globs_must_name_layers():
    with pytest.raises(HintError, match=r"'\*fc_2' \(close: \['fc2'.*match no layer"):
        _compile(NormedMLP("none"), presets.tensor_parallel(2, column=("*fc1",), row=("*fc_2",)))
    c = _compile(NormedMLP("none"), presets.tensor_parallel(2, column=("fc1",), row=("fc2",)))
    assert c.deduction.sbp["fc1.weight"] == (S(0),)  # exact names are fine
