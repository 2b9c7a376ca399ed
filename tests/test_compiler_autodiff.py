"""Autodiff: the backward graph gives torch.autograd's gradients; training graphs are well formed."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from sbplab.compiler import SGD, Adam, GraphBuilder, GraphError, add_backward, from_torch, interpret
from sbplab.compiler.training.autodiff import attach_gradients, differentiate
from sbplab.compiler.training.op_vjp import recipe
from sbplab.models import CNN, GPT, MLP, CNNConfig, GPTConfig, MLPConfig, WideDeep, WideDeepConfig
from sbplab.ops.registry import get_op

ZOO = [(MLP, MLPConfig()), (GPT, GPTConfig(n_layer=2)), (WideDeep, WideDeepConfig()), (CNN, CNNConfig())]


@pytest.mark.parametrize("cls,cfg", ZOO, ids=[c.__name__ for c, _ in ZOO])
def test_zoo_gradients_equal_autograd(cls, cfg):
    torch.manual_seed(0)
    m = cls(cfg)
    xs, y = m.example_batch(4)
    g = from_torch(m, xs, m.loss_fn, y)
    add_backward(g)
    env = interpret(g, dict(zip(g.inputs, list(xs) + [y])))
    m.loss_fn(m(*xs), y).backward()
    for n, p in m.named_parameters():
        assert g.grads[n] == f"{n}.grad" and g.tensors[g.grads[n]].role == "grad"
        torch.testing.assert_close(env[g.grads[n]], p.grad, rtol=1e-5, atol=1e-6)
    assert all(op.forward_op is not None for op in g.ops_in("backward") if op.type not in ("fill", "add", "scale"))


def test_micro_batched_graph_accumulates_and_scales():
    m = MLP(MLPConfig(n_blocks=1))
    xs, y = m.example_batch(2)
    g = from_torch(m, xs, m.loss_fn, y)
    add_backward(g, micro_batches=4)
    seed = next(op for op in g.ops if op.type == "fill")
    assert seed.attrs["value"] == 0.25  # d(mean over 4 micro-batches)/d(one loss)
    for p, gr in g.grads.items():
        op = g.producer(gr)
        assert op.type == "acc" and op.inputs[0] == f"{p}.grad_mb"
    assert g.producer(g.loss_value).attrs["scale"] == 0.25


def test_optimizers_add_state_and_updates():
    m = MLP(MLPConfig(n_blocks=0))
    xs, y = m.example_batch(2)
    g = from_torch(m, xs, m.loss_fn, y)
    add_backward(g)
    Adam(lr=0.1).build(g)
    states = [n for n, t in g.tensors.items() if t.role == "state"]
    assert "adam.step" in states and "head.weight.exp_avg" in states and "head.weight.exp_avg_sq" in states
    assert g.state_updates["head.weight"] == "head.weight.next"
    assert g.tensors["head.weight.exp_avg"].value is None  # zeros are made on demand
    assert float(g.tensors["head.weight.exp_avg"].initial_value().abs().sum()) == 0.0
    with pytest.raises(GraphError, match="already has an optimizer"):
        Adam().build(g)
    with pytest.raises(ValueError, match="nesterov=True\\) needs momentum"):
        SGD(nesterov=True)


def test_backward_errors_are_clear():
    b = GraphBuilder()
    x = b.input("x", (4, 3))
    w = b.param("w", (2, 3))
    y = b.linear(x, w)
    with pytest.raises(GraphError, match="has no loss"):
        add_backward(b.build(outputs=[y]))
    b2 = GraphBuilder()
    x2 = b2.input("x", (4, 3))
    b2.param("w", (2, 3))
    with pytest.raises(GraphError, match="does not depend on any parameter"):
        add_backward(b2.build(loss=b2.sum(x2, dims=None)))


def test_unused_parameter_gets_a_zero_gradient():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.used(x)

    g = from_torch(M(), (torch.randn(4, 3),), nn.functional.cross_entropy, torch.randint(0, 2, (4,)))
    add_backward(g)
    env = interpret(g, {"x": torch.randn(4, 3), "target": torch.randint(0, 2, (4,))})
    assert "unused.weight" not in g.params  # never traced, so not in the graph at all
    assert set(g.grads) == {"used.weight", "used.bias"}
    assert env[g.grads["used.bias"]].shape == (2,)


def every_op_graph():
    """A hand-built graph through every differentiable op of the registry, and its feeds."""
    b = GraphBuilder(seed=1)
    x = b.input("x", (4, 3, 6))
    ids = b.input("ids", (4, 3), torch.int64)
    w, bias = b.param("w", (5, 6)), b.param("bias", (5,))
    emb, ln_w, ln_b = b.param("emb", (7, 6)), b.param("ln.w", (6,), "ones"), b.param("ln.b", (6,), "zeros")
    h = x + b.embedding(ids, emb)  # (4, 3, 6)
    h = b.layer_norm(h, ln_w, ln_b, normalized_shape=(6,), eps=1e-5)
    y = b.linear(h, w, bias)  # (4, 3, 5)
    a = b.gelu(y) * b.tanh(y) - b.relu(y).exp() / (b.relu(y) + 2.0)  # mul, sub, div, exp, add_scalar
    s = b.softmax(a, dim=-1) @ b.transpose(a, dim0=-1, dim1=-2)  # (4, 3, 3): a batched matmul
    s = b.permute(s, dims=(0, 2, 1)).reshape(shape=(4, 9)).view(shape=(4, 9))
    c = b.concat(s, b.slice(b.log_softmax(s, dim=-1), dim=1, start=2, stop=7, step=1), dim=1)  # (4, 14)
    g = b.gather(c, b.input("idx", (4, 2), torch.int64), dim=1)  # (4, 2)
    m = b.max(c, dim=1, keepdim=True) + b.min(c, dim=1, keepdim=True) - b.mean(c, dims=(1,), keepdim=True)
    z = b.concat(g, m, -b.sum(c, dims=(1,), keepdim=True) * 0.1, dim=1)  # (4, 4)
    feeds = {"x": torch.randn(4, 3, 6), "ids": torch.randint(0, 7, (4, 3)), "t": torch.randint(0, 4, (4,)),
             "idx": torch.randint(0, 14, (4, 2))}
    return b.build(b.cross_entropy(z, b.input("t", (4,), torch.int64))), feeds


def _torch_grads(g, feeds):
    """Single-device torch: the graph's forward kernels run eagerly, differentiated by torch.autograd."""
    env = {}
    for n in g.sources():
        t = g.tensors[n]
        env[n] = feeds[n] if t.role == "input" else t.initial_value().clone().requires_grad_(t.role == "param")
    for op in g.ops:
        env.update(zip(op.outputs, get_op(op.type).kernel([env[i] for i in op.inputs], dict(op.attrs))))
    env[g.loss].backward()
    return {p: env[p].grad for p in g.params}


@pytest.mark.parametrize("cls,cfg", ZOO, ids=[c.__name__ for c, _ in ZOO])
def test_torch_backward_equals_autograd_on_the_zoo(cls, cfg):
    torch.manual_seed(0)
    m = cls(cfg)
    xs, y = m.example_batch(4)
    g = from_torch(m, xs, m.loss_fn, y)
    attach_gradients(g, differentiate(g, g.loss), 1)
    env = interpret(g, dict(zip(g.inputs, list(xs) + [y])))
    m.loss_fn(m(*xs), y).backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(env[g.grads[n]], p.grad, rtol=1e-5, atol=1e-6)
    backward = [op for op in g.ops_in("backward") if op.type not in ("fill", "add", "scale")]
    assert backward and all(op.type.startswith(("aten.", "sbplab.")) and op.forward_op in g.op_by_name for op in backward)
    for op in backward:  # each backward op speaks in its forward op's module
        assert op.module == g.op_by_name[op.forward_op].module


def test_torch_backward_of_every_op_equals_autograd():
    torch.manual_seed(0)
    g, feeds = every_op_graph()
    want = _torch_grads(g, feeds)
    assert {op.type for op in g.ops} >= {"linear", "matmul", "layer_norm", "softmax", "log_softmax", "max", "min",
                                        "gather", "embedding", "concat", "slice", "permute", "view", "div"}
    attach_gradients(g, differentiate(g, g.loss), 1)
    got = interpret(g, feeds)
    for p in g.params:
        torch.testing.assert_close(got[g.grads[p]], want[p], rtol=1e-5, atol=1e-6)


def test_backward_recomputes_what_the_op_does_not_output():
    """layer norm's backward needs the forward's mean and rstd: made again from its inputs; relu's reads the
    op's own output; the trace of a repeated op is made once."""
    from sbplab.ops.registry import TensorMeta

    x, w = TensorMeta((4, 8)), TensorMeta((8,))
    ln = recipe("layer_norm", (x, w, w), (("eps", 1e-5), ("normalized_shape", (8,))), (True,) * 3, (True,))
    assert [c.name for c in ln.calls if c.recompute] == ["aten.native_layer_norm.default"]
    relu = recipe("relu", (x,), (), (True,), (True,))
    assert relu.recomputed == 0 and ("out", 0) in relu.calls[0].reads
    before = recipe.cache_info().hits
    recipe("relu", (x,), (), (True,), (True,))
    assert recipe.cache_info().hits == before + 1


def test_an_op_torch_cannot_differentiate_is_named():
    """A kernel torch cannot trace on fake tensors (it reads a value: data-dependent) is a GraphError
    naming the op and its shapes."""
    from sbplab.ops.registry import REGISTRY, OpDef, register

    register(OpDef("scaled_by_own_sum", lambda ins, a: [ins[0]], lambda ins, a: [],
                   lambda xs, a: (xs[0] * xs[0].detach().sum().item(),)))
    try:
        b = GraphBuilder()
        g = b.build(b.sum(b.op("scaled_by_own_sum", b.param("w", (3,))), dims=None))
        with pytest.raises(GraphError, match=r"could not differentiate op 'scaled_by_own_sum' on inputs \[\(3,\)\]"):
            add_backward(g)
    finally:
        REGISTRY.pop("scaled_by_own_sum")
