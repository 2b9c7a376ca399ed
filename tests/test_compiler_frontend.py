"""from_torch and the builder: graphs that compute what the torch module computes, clear errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from sbplab.compiler import (
    SGD,
    GraphBuilder,
    GraphError,
    UnsupportedModelError,
    add_backward,
    compile,
    from_torch,
    interpret,
    presets,
)
from sbplab.models import CNN, GPT, MLP, CNNConfig, GPTConfig, MLPConfig, WideDeep, WideDeepConfig

ZOO = [(MLP, MLPConfig()), (GPT, GPTConfig(n_layer=1)), (WideDeep, WideDeepConfig()), (CNN, CNNConfig())]


def _feeds(graph, xs, y=None):
    return dict(zip(graph.inputs, list(xs) + ([y] if y is not None else [])))


@pytest.mark.parametrize("cls,cfg", ZOO, ids=[c.__name__ for c, _ in ZOO])
def test_zoo_forward_and_loss_equal_torch(cls, cfg):
    torch.manual_seed(0)
    model = cls(cfg)
    xs, y = model.example_batch(4)
    g = from_torch(model, xs)
    out = interpret(g, _feeds(g, xs))[g.outputs[0]]
    torch.testing.assert_close(out, model(*xs))
    gl = from_torch(model, xs, model.loss_fn, y)
    assert gl.loss is not None and gl.inputs[-1] == "target"
    loss = interpret(gl, _feeds(gl, xs, y))[gl.loss]
    torch.testing.assert_close(loss, model.loss_fn(model(*xs), y))
    assert set(gl.params) == {n for n, _ in model.named_parameters()}


class Functional(nn.Module):
    """Exercises functions, methods, operators, scalars, indexing and constant folding."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 8) * 0.3)
        self.scale = nn.Parameter(torch.ones(8))
        self.register_buffer("offset", torch.linspace(-1, 1, 10))

    def forward(self, x):  # x (4, 3, 6)
        B, T, C = x.size()
        h = F.linear(x, self.w.t()) * (1.0 / math.sqrt(C)) + self.offset[1:9]  # buffer slice: folded
        a, b = h.split(4, dim=-1)
        c = torch.cat([b, a], dim=2).transpose(1, 2).permute(0, 2, 1)  # back to (B, T, 8)
        d = (c @ c.transpose(-2, -1)).softmax(dim=-1) @ c  # attention-like
        e = torch.tanh(d) - 0.5 * F.gelu(d, approximate="tanh") + 1.0 - torch.exp(d * 0.1)
        f = e[:, 1:, :].flatten(1).unsqueeze(1).squeeze(1).view(B, -1, 8)
        g = f.mean(dim=1) * self.scale + f.sum(dim=(1,)) / 3 - f.amax(dim=1)
        return F.log_softmax(g, dim=-1)[..., :5] / 2 + torch.relu(g[:, None, 0:5]).reshape(B, 5)


def test_functional_model_forward_and_gradients_equal_torch():
    torch.manual_seed(0)
    m = Functional()
    x, target = torch.randn(4, 3, 6), torch.randint(0, 5, (4,))
    g = from_torch(m, (x,), F.cross_entropy, target)
    assert not any(op.type == "slice" and op.inputs[0].startswith("const") for op in g.ops)
    add_backward(g)
    env = interpret(g, {"x": x, "target": target})
    loss = F.cross_entropy(m(x), target)
    loss.backward()
    torch.testing.assert_close(env[g.loss], loss)
    for n, p in m.named_parameters():
        torch.testing.assert_close(env[g.grads[n]], p.grad, rtol=1e-5, atol=1e-6)


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        h = self.bn(self.conv(x))  # BatchNorm2d: no op
        h = self.pool(h)  # MaxPool2d: no op
        h = torch.sigmoid(h)  # no op
        return h.masked_fill(h > 0.5, 0.0).sum()  # masked_fill: no op


def test_unsupported_model_lists_every_problem_with_its_line():
    with pytest.raises(UnsupportedModelError) as e:
        from_torch(Unsupported(), (torch.randn(2, 3, 8, 8),))
    msg = str(e.value)
    assert len(e.value.problems) == 5, msg  # downstream of the first problem, the rest are listed too
    for what in ("torch.nn.modules.batchnorm.BatchNorm2d (bn)", "MaxPool2d (pool)", "function torch.sigmoid",
                 "function operator.gt", "tensor method .masked_fill()"):
        assert what in msg
    for _, _, src in e.value.problems:
        assert src.startswith("test_compiler_frontend.py:")
    assert "h = self.pool(h)" in msg


def test_dropout_is_identity_only_without_randomness():
    class Drop(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.fc, self.drop = nn.Linear(4, 4), nn.Dropout(p)

        def forward(self, x):
            return self.drop(self.fc(x))

    x = torch.randn(2, 4)
    g = from_torch(Drop(0.0), (x,))
    assert [op.type for op in g.ops] == ["linear"]
    with pytest.raises(UnsupportedModelError, match="dropout with p > 0"):
        from_torch(Drop(0.1), (x,))
    m = Drop(0.1).eval()
    assert [op.type for op in from_torch(m, (x,)).ops] == ["linear"]


def test_tied_weights_are_one_parameter_with_summed_gradients():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids):
            return F.linear(self.emb(ids), self.emb.weight)  # (N, 10) logits with the same table

    torch.manual_seed(0)
    m, ids, y = Tied(), torch.randint(0, 10, (6,)), torch.randint(0, 10, (6,))
    g = from_torch(m, (ids,), F.cross_entropy, y)
    assert g.params == ["emb.weight"]
    add_backward(g)
    env = interpret(g, {"ids": ids, "target": y})
    F.cross_entropy(m(ids), y).backward()
    torch.testing.assert_close(env[g.grads["emb.weight"]], m.emb.weight.grad)


def test_dump_shows_sbp_and_local_shape_once_deduced():
    model = MLP(MLPConfig(n_blocks=1))
    xs, y = model.example_batch(8)
    g = from_torch(model, xs, model.loss_fn, y)
    text = g.dump()
    assert "%blocks.0.fc1 = linear(%proj_in, %blocks.0.fc1.weight, %blocks.0.fc1.bias)" in text
    assert "f32[8, 64]" in text and "mlp.py:" in text
    c = compile(model, xs, loss_fn=model.loss_fn, target=y, optimizer=SGD(lr=0.1), strategy=presets.data_parallel(4))
    text = c.dump()
    assert "%x: f32[8, 16] input (S(0)) local [2, 16]" in text
    grad = next(line for line in text.splitlines() if line.strip().startswith("%blocks.0.fc1.weight.grad ="))
    assert "aten.mm.default(" in grad and "f32[64, 32] (P) local [64, 32]" in grad  # from S(0) rows: partial
    assert "<- box %blocks.0.fc1.weight.grad (P) -> (B): all_reduce" in text


def test_builder_graph_trains_like_torch():
    torch.manual_seed(0)
    b = GraphBuilder(seed=3)
    x = b.input("x", (8, 5))
    t = b.input("t", (8,), torch.int64)
    w1 = b.param("fc1.weight", (16, 5))
    w2 = b.param("fc2.weight", (3, 16))
    h = b.relu(b.linear(x, w1)) * 2.0 - 0.5
    loss = b.cross_entropy(b.linear(h, w2), t)
    g = b.build(loss)
    xv, tv = torch.randn(8, 5), torch.randint(0, 3, (8,))
    from sbplab.compiler import compile_graph

    c = compile_graph(g, SGD(lr=0.5), presets.data_parallel(2))
    ex = c.executor()
    losses = [ex.step({"x": xv, "t": tv}) for _ in range(2)]
    ref1 = g.tensors["fc1.weight"].value.clone().requires_grad_()
    ref2 = g.tensors["fc2.weight"].value.clone().requires_grad_()
    opt = torch.optim.SGD([ref1, ref2], lr=0.5)
    for i in range(2):
        opt.zero_grad()
        lv = F.cross_entropy(F.linear(torch.relu(F.linear(xv, ref1)) * 2.0 - 0.5, ref2), tv)
        lv.backward()
        opt.step()
        assert losses[i] == pytest.approx(lv.item(), abs=1e-6)
    torch.testing.assert_close(ex.value("fc1.weight"), ref1.detach())


def test_builder_errors_are_clear():
    b = GraphBuilder()
    x = b.input("x", (4, 3))
    with pytest.raises(AttributeError, match="registry ops are"):
        b.no_such_op(x)
    with pytest.raises(GraphError, match="linear"):
        b.linear(x, b.param("w", (5, 4)))
    with pytest.raises(GraphError, match="must be a scalar"):
        b.build(loss=x)


def test_micro_batches_must_divide_the_batch():
    model = MLP(MLPConfig(n_blocks=0))
    xs, y = model.example_batch(6)
    with pytest.raises(GraphError, match="does not divide into 4 micro-batches"):
        compile(model, xs, loss_fn=model.loss_fn, target=y, optimizer=SGD(), strategy=presets.pipeline(2, 4))
