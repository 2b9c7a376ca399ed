"""The ATen front door: models torch.fx cannot map (decorated forwards, keyword and defaulted arguments,
``**kwargs``, modules made or returning None inside forward, SDPA, BatchNorm, tied weights, a
library custom op) capture with torch.export and torch's autograd, keep the user's module names,
and train equal to single-device torch; what cannot be captured is a clear sbplab error."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sbplab as sl
from sbplab.compiler.frontend.aten_capture import CaptureError
from sbplab.compiler.training.training_graph import aten_training_graph
from sbplab.models import corpus
from sbplab.sbp import S


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class _SideEffect(nn.Module):
    def forward(self, x):
        return None


class Awkward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head, self.side = nn.Linear(8, 16), nn.Linear(16, 3), _SideEffect()

    @_logged
    def forward(self, x, scale: float = 2.0, mask=None, **extra):
        self.side(x)
        h = nn.GELU()(self.fc(x)) * scale  # a module built inside forward
        if mask is not None:
            h = h.masked_fill(mask, 0.0)
        return self.head(F.scaled_dot_product_attention(h[:, None], h[:, None], h[:, None])[:, 0])


def _torch_losses(model, inputs, loss_fn, target, steps, lr=0.1):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(m(**inputs), target)
        loss.backward()
        opt.step()
        out.append(float(loss))
    return out, m


def test_awkward_forward_trains_like_torch_under_data_parallel():
    torch.manual_seed(0)
    model = Awkward()
    x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
    mask = torch.rand(8, 16) > 0.7
    inputs = {"x": x, "mask": mask}
    with pytest.raises(sl.SbplabError, match="capture='aten'"):  # torch.fx cannot trace the decorated forward
        sl.compile(model, (x,), loss_fn=F.cross_entropy, target=y, capture="fx")
    step = sl.compile(model, inputs, loss_fn=F.cross_entropy, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.data_parallel(2))
    assert step.graph.inputs == ["x", "mask", "target"]
    ex = step.executor()
    got = [ex.step({**inputs, "target": y}) for _ in range(3)]
    want, trained = _torch_losses(model, inputs, F.cross_entropy, y, 3)
    assert got == pytest.approx(want, abs=1e-6)
    torch.testing.assert_close(ex.params()["fc.weight"], trained.fc.weight.detach(), atol=1e-6, rtol=1e-5)
    assert step.deduction.sbp["x"] == (S(0),)  # data parallel split the keyword input


@pytest.fixture(scope="module")
def gpt2_graph():
    pytest.importorskip("transformers")
    b = corpus.build("gpt2")
    return aten_training_graph(b.model, b.inputs, None, None)


def test_ops_keep_the_users_module_paths_and_lines(gpt2_graph):
    g = gpt2_graph
    aten = [op for op in g.ops if op.type.startswith("aten.")]
    modules = {op.module for op in aten}
    assert "transformer.h.0.attn.c_attn" in modules and "transformer.h.1.mlp.c_fc" in modules
    fwd = [op for op in aten if op.phase == "forward"]
    bwd = [op for op in aten if op.phase == "backward"]
    assert fwd and bwd
    # a backward op has the module of the forward op it differentiates (the loss is the model's top level)
    assert sum(bool(op.module) for op in bwd) >= 0.8 * len(bwd)
    assert sum(op.forward_op is not None for op in bwd) >= 0.9 * len(bwd)
    assert all(g.op_by_name[op.forward_op].phase == "forward" for op in bwd if op.forward_op)
    assert any("modeling_gpt2.py" in op.source for op in fwd)
    assert g.op_by_name["transformer.h.0.attn.c_attn.addmm"].type == "aten.addmm.default"


def test_tied_weights_are_one_parameter_with_summed_gradients(gpt2_graph):
    g = gpt2_graph
    assert "transformer.wte.weight" in g.params and "lm_head.weight" not in g.params
    grad = g.grads["transformer.wte.weight"]
    producer = g.producer(g.producer(grad).inputs[0]) if g.producer(grad).type == "scale" else g.producer(grad)
    assert producer.type == "aten.add.Tensor"  # the embedding's and the output layer's gradients


def test_batchnorm_statistics_are_synchronised_and_kept():
    pytest.importorskip("transformers")
    b = corpus.build("resnet")
    step = sl.compile(b.model, b.inputs, optimizer=sl.SGD(lr=0.1), strategy=sl.presets.data_parallel(2))
    g = step.graph
    stat = "resnet.embedder.embedder.normalization.running_mean"
    assert stat in g.state_updates
    ex = step.executor()
    ex.step(b.inputs)
    ref = copy.deepcopy(b.model)
    ref(**b.inputs).loss.backward()
    torch.testing.assert_close(ex.value(stat), ref.get_buffer(stat), atol=1e-6, rtol=1e-5)


def test_data_dependent_control_flow_is_a_capture_error():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if x.sum() > 0:  # decided by the data
                return self.fc(x)
            return -self.fc(x)

    with pytest.raises(CaptureError, match="Data-dependent") as e:
        sl.compile(Branchy(), (torch.randn(4, 4),), loss_fn=F.cross_entropy, target=torch.zeros(4, dtype=torch.long),
                   capture="aten")
    assert isinstance(e.value, sl.SbplabError)


def test_unknown_capture_mode_is_refused():
    m = sl.models.MLP(sl.models.MLPConfig())
    (x,), y = m.example_batch(4)
    with pytest.raises(sl.SbplabError, match="capture must be one of"):
        sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, capture="jit")


def test_fx_and_aten_captures_of_the_zoo_gpt_agree():
    m = sl.models.GPT(sl.models.GPTConfig(n_layer=1))
    (idx,), t = m.example_batch(4)
    losses = {}
    for capture in ("fx", "aten"):
        step = sl.compile(m, (idx,), loss_fn=m.loss_fn, target=t, optimizer=sl.SGD(lr=0.1),
                          strategy=sl.presets.data_parallel(2), capture=capture)
        ex = step.executor()
        losses[capture] = [ex.step({"idx": idx, "target": t}) for _ in range(2)]
    assert losses["aten"] == pytest.approx(losses["fx"], abs=1e-5)


@torch.library.custom_op("sbplab_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


twice.register_autograd(lambda ctx, grad: grad * 2)


class UsesCustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        return self.fc(twice(x))


def test_an_op_without_a_rule_runs_replicated_until_a_rule_is_registered():
    torch.manual_seed(0)
    model, x, y = UsesCustomOp(), torch.randn(8, 6), torch.randint(0, 4, (8,))
    name = "sbplab_test.twice.default"
    sl.ops.aten.RULES.pop(name, None)
    sl.ops.aten.rules.forget(name)
    with pytest.warns(sl.ReplicatedOpWarning, match=name):
        step = sl.compile(model, (x,), loss_fn=F.cross_entropy, target=y, strategy=sl.presets.data_parallel(2))
    op = next(o for o in step.graph.ops if o.type == name)
    assert step.deduction.sbp[op.outputs[0]] == (sl.B,)  # whole on every rank
    sl.register_rule(name, lambda ins, outs, attrs: [sl.Signature((S(0),), (S(0),))])
    with warnings.catch_warnings():
        warnings.simplefilter("error", sl.ReplicatedOpWarning)
        step = sl.compile(model, (x,), loss_fn=F.cross_entropy, target=y, optimizer=sl.SGD(lr=0.1),
                          strategy=sl.presets.data_parallel(2))
    op = next(o for o in step.graph.ops if o.type == name)
    assert step.deduction.sbp[op.outputs[0]] == (S(0),)
    ex = step.executor()
    got = [ex.step({"x": x, "target": y}) for _ in range(2)]
    want, _ = _torch_losses(model, {"x": x}, F.cross_entropy, y, 2)
    assert got == pytest.approx(want, abs=1e-6)


def test_a_model_on_the_meta_device_compiles_without_allocating(gpt2_graph):
    """Built on the meta device, the model is traced as fake tensors: the same graph as a real model's,
    gradients included (a meta kernel of nll_loss would bypass autograd), and nothing allocated."""
    import transformers as tf

    b = corpus.build("gpt2")
    with torch.device("meta"):
        meta_model = tf.GPT2LMHeadModel(b.model.config).train()
        ids = torch.zeros(b.inputs["input_ids"].shape, dtype=torch.long)
    step = sl.compile(meta_model, {"input_ids": ids, "labels": ids}, strategy=sl.presets.zero(2))
    g = step.graph
    assert len(g.ops_in("backward")) > 100 and set(g.grads) == set(g.params)
    assert [op.type for op in g.ops] == [op.type for op in gpt2_graph.ops]
    assert all(g.tensors[p].value.device.type == "meta" for p in g.params)
    assert step.memory.ranks[0].params > 0
