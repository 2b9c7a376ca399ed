"""Identical layers captured once: the graph built from a two-layer capture (the middle layer read off
the first and the last, ``layer_pair``) or a three-layer capture with the middle layer copied
(``layer_repeat``) is, node for node, the graph a capture of every layer gives (names, attributes, module paths,
source lines, the backward op each backward node belongs to, parameters, gradients), on transformers'
GPT-2 and Llama and the zoo GPT; a stack whose layers differ falls back to the whole capture; and the
step compiled from the repeated graph trains like single-device torch."""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
from tiny_hf import tiny_hf

import sbplab as sl
from sbplab.compiler.frontend.aten_capture import _joint, capture_aten
from sbplab.compiler.frontend.layer_pair import repeat_pair, three_layer_capture
from sbplab.compiler.frontend.layer_repeat import cut_to, find_layer_stack, repeat_layers

LAYERS = 5


def _signature(g: sl.compiler.ir.Graph) -> tuple:
    ops = [(o.name, o.type, tuple(o.inputs), tuple(o.outputs), repr(sorted(o.attrs.items(), key=str)), o.phase,
            o.module, o.source, o.forward_op) for o in g.ops]
    tensors = [(t.name, t.meta.shape, t.meta.dtype, t.role, t.module) for t in g.tensors.values()]
    return ops, tensors, g.loss, dict(g.state_updates), list(g.params), list(g.inputs)


def _hf(kind: str, **extra):
    model = tiny_hf(kind, LAYERS, **extra)
    ids = torch.zeros(2, 8, dtype=torch.int64, device="meta")
    return model, (), {"input_ids": ids, "labels": ids}, None, ()


def _zoo():
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(vocab_size=64, block_size=8, n_layer=LAYERS, n_head=4, n_embd=32))
    (idx,), t = m.example_batch(2)
    return m, (idx,), {}, m.loss_fn, (t,)


def _repeated(model, args, kwargs, loss_fn, targets, keep: int = 3):
    """The repeated route taken by hand, so a test knows it was not a fallback: three layers captured
    (``layer_repeat``) or two (``layer_pair``)."""
    stack = find_layer_stack(model)
    assert stack is not None and stack.n == LAYERS
    flat = (*args, *kwargs.values(), *targets)
    with cut_to(model, stack, keep):
        gm = _joint(model, flat, loss_fn, len(args), tuple(kwargs), None)
    assert len(list(model.get_submodule(stack.path))) == LAYERS  # the cut is undone
    return (repeat_layers if keep == 3 else repeat_pair)(gm, stack)


@pytest.mark.parametrize("keep", [2, 3])
@pytest.mark.parametrize("which", ["gpt2", "llama", "zoo"])
def test_repeated_layers_give_the_graph_of_a_whole_capture(which, keep):
    model, args, kwargs, loss_fn, targets = _zoo() if which == "zoo" else _hf(which)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole, whole_grads = capture_aten(model, args, kwargs, loss_fn, targets, repeat=False)
        assert _repeated(model, args, kwargs, loss_fn, targets, keep) is not None
        with three_layer_capture() if keep == 3 else contextlib.nullcontext():
            fast, fast_grads = capture_aten(model, args, kwargs, loss_fn, targets)
    assert sum(o.module.startswith(f"{find_layer_stack(model).path}.{LAYERS - 2}.") for o in fast.ops) > 10
    assert _signature(fast) == _signature(whole)
    assert fast_grads == whole_grads


class _Scaled(torch.nn.Module):
    """A layer whose forward reads its index (as a layer_idx attribute, which the layer comparison lets
    differ): only the captured graphs show that layers 1 and 2 differ."""

    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.fc, self.layer_idx = torch.nn.Linear(8, 8), layer_idx

    def forward(self, x):
        return x + torch.tanh(self.fc(x)) / (self.layer_idx + 1)


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Scaled(k) for k in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_layers_that_depend_on_their_index_are_captured_whole():
    # GPT-2 can scale attention by 1 / (layer index + 1): its attention's scaling attribute differs
    model, *_ = _hf("gpt2", scale_attn_by_inverse_layer_idx=True)
    assert find_layer_stack(model) is None
    # a layer index read in forward: the graphs of layers 1 and 2 differ, so the whole model is captured
    torch.manual_seed(0)
    model, x, y = _Stack(), torch.randn(4, 8), torch.randn(4, 8)
    loss_fn = torch.nn.functional.mse_loss
    assert _repeated(model, (x,), {}, loss_fn, (y,)) is None
    assert _repeated(model, (x,), {}, loss_fn, (y,), keep=2) is None  # layers 0 and 1 differ as well
    fast, _ = capture_aten(model, (x,), {}, loss_fn, (y,))
    whole, _ = capture_aten(model, (x,), {}, loss_fn, (y,), repeat=False)
    assert _signature(fast) == _signature(whole)


def test_a_step_compiled_from_repeated_layers_trains_like_torch():
    model, (idx,), _, loss_fn, (t,) = _zoo()
    step = sl.compile(model, (idx,), loss_fn=loss_fn, target=t, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.data_parallel(2), capture="aten")
    ex = step.executor()
    got = [ex.step({"idx": idx, "target": t}) for _ in range(2)]
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    want = []
    for _ in range(2):
        opt.zero_grad()
        loss = loss_fn(ref(idx), t)
        loss.backward()
        opt.step()
        want.append(float(loss))
    assert got == pytest.approx(want, abs=1e-5)
    name = f"blocks.{LAYERS - 2}.mlp.fc1.weight"
    torch.testing.assert_close(ex.params()[name], dict(ref.named_parameters())[name].detach(), atol=1e-5, rtol=1e-4)


def test_stacks_too_short_or_unlike_are_not_repeated():
    short = sl.models.GPT(sl.models.GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=32))
    assert find_layer_stack(short) is None
    mixed = sl.models.GPT(sl.models.GPTConfig(vocab_size=64, block_size=8, n_layer=LAYERS, n_head=4, n_embd=32))
    mixed.blocks[3] = copy.deepcopy(mixed.blocks[3]).to(torch.float64)
    assert find_layer_stack(mixed) is None


def test_middle_layers_copied_as_ops_match_node_by_node():
    # the two-layer route writes middle layers 2..n-2 as copies of converted ops (layer_copy.py); the graph,
    # consumer lists and name counters included, is the one converting every copied node gives
    from sbplab.compiler.frontend.layer_copy import CopiedLayer, node_by_node

    model, args, kwargs, loss_fn, targets = _hf("llama")
    whole = _repeated(model, args, kwargs, loss_fn, targets, keep=2)
    assert sum(isinstance(n, CopiedLayer) for n in whole.graph.nodes) == 2 * (LAYERS - 3)  # forward, backward

    def full(g):
        tensors = [(t.name, t.meta, t.role, t.producer, tuple(t.consumers), t.module) for t in g.tensors.values()]
        return _signature(g), tensors, dict(g._counts)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast, fast_grads = capture_aten(model, args, kwargs, loss_fn, targets)
        with node_by_node():
            slow, slow_grads = capture_aten(model, args, kwargs, loss_fn, targets)
    assert full(fast) == full(slow)
    assert fast_grads == slow_grads
