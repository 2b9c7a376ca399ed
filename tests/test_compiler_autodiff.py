"""Autodiff: the backward graph gives torch.autograd's gradients; training graphs are well formed."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from sbplab.compiler import SGD, Adam, GraphBuilder, GraphError, add_backward, from_torch, interpret
from sbplab.models import CNN, GPT, MLP, CNNConfig, GPTConfig, MLPConfig, WideDeep, WideDeepConfig

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
