"""Tracing shortcuts change nothing: memoised meta computations, source lines found from the frames,
and one copy of a constant many layers read."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn

from sbplab.compiler import from_torch
from sbplab.compiler.frontend import fx_memo
from sbplab.compiler.frontend.fx_trace import ShapeTracer
from sbplab.gc_pause import gc_paused, without_gc
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig
from sbplab.models.gpt import causal_mask


def _gpt(layers: int = 3) -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=layers, n_head=2, n_embd=16))
    (idx,), _ = m.example_batch(4)
    return m, idx


def _summary(graph) -> list:
    ops = [(op.name, op.type, op.inputs, op.outputs, op.attrs, op.module, op.source) for op in graph.ops]
    tensors = [(n, t.meta, t.role, t.module) for n, t in graph.tensors.items()]
    return [ops, tensors, graph.inputs, graph.params, graph.outputs, graph.loss]


def test_memoised_metas_give_the_graph_computing_every_meta_gives(monkeypatch):
    m, idx = _gpt()
    fast = from_torch(m, (idx,), GPT.loss_fn, idx)

    def never(*args, **kwargs):
        raise fx_memo.NoKey

    monkeypatch.setattr(fx_memo, "call_key", never)
    slow = from_torch(m, (idx,), GPT.loss_fn, idx)
    assert _summary(fast) == _summary(slow)
    for name, t in fast.tensors.items():
        if t.value is not None:
            assert torch.equal(t.value, slow.tensors[name].value), name


def test_every_node_gets_its_own_meta_tensor():
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=4, n_classes=4))
    tracer = ShapeTracer({"x": torch.randn(8, 8)})
    fxg = tracer.trace(m)
    metas = [n.meta["sbplab_meta"] for n in fxg.nodes if isinstance(n.meta.get("sbplab_meta"), torch.Tensor)]
    assert len(metas) > 15
    assert len({id(t) for t in metas}) == len(metas)  # an in-place op on one cannot change another
    hits = [v for v in tracer._memo.values() if isinstance(v, fx_memo.MetaSpec)]
    assert hits, "identical blocks should have been answered from the memo"


def test_in_place_shape_change_is_seen_by_later_code():
    class Grow(nn.Module):
        def forward(self, x):
            h = x.view(4, 2)
            h.unsqueeze_(0)  # in place: never memoised, and h's own meta changes
            g = x.view(4, 2)  # the same call as above: must not share h's (now 3-D) meta
            return h.size(0) + h.dim() * 10 + g.dim() * 100

    tracer = ShapeTracer({"x": torch.randn(8)})
    fxg = tracer.trace(Grow())
    out = next(n for n in fxg.nodes if n.op == "output").args[0]
    assert out == 1 + 3 * 10 + 2 * 100


def test_layers_share_one_copy_of_the_causal_mask():
    m, idx = _gpt(layers=3)
    g = from_torch(m, (idx,), GPT.loss_fn, idx)
    masks = [t for t in g.tensors.values() if t.role == "const" and t.shape == (8, 8)]
    assert len(masks) == 3  # one const per layer, as before: the graph keeps its shape
    assert masks[0].value is masks[1].value is masks[2].value
    assert torch.equal(masks[0].value, torch.full((8, 8), -1e9).triu(1))
    assert torch.equal(causal_mask(8), masks[0].value)


def test_sources_name_the_user_line():
    m, idx = _gpt(layers=1)
    g = from_torch(m, (idx,), GPT.loss_fn, idx)
    soft = next(op for op in g.ops if op.type == "softmax")
    assert soft.source.startswith("gpt.py:") and soft.source.endswith("att = F.softmax(att + mask, dim=-1)")
    loss = next(op for op in g.ops if op.type == "cross_entropy")
    assert loss.source.startswith("gpt.py:") and "F.cross_entropy" in loss.source


def test_gc_pause_restores_the_collector_also_on_errors():
    @without_gc
    def boom():
        assert not gc.isenabled()
        raise ValueError("inside a pass")

    assert gc.isenabled()
    with pytest.raises(ValueError, match="inside a pass"):
        boom()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.enable()
