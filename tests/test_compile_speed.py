"""The compiler's shortcuts give what the long way gives, on transformers' GPT-2 and Llama (small, meta device):

- the capture traces the module once (AOTAutograd straight on it) and gets the graph torch.export then
  AOTAutograd give, node for node, module paths and source lines included (and on the zoo GPT);

- an op that ``torch.utils.flop_counter`` cannot count is not run under ``FlopCounterMode``: for every op of
  the captured graphs, the FLOPs the registry reports equal the counter's own count of that call, and the
  ops said to count nothing do count zero there (the ranking's FLOP tie-break is unchanged);
- a tensor-parallel hint restricted to a few names finds its tensors by lookup: the targets equal the
  glob matched against every tensor of its role, in graph order.
"""

from __future__ import annotations

import fnmatch
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import sbplab as sl
from sbplab.compiler.deduction.strategy import _by_role
from sbplab.compiler.training.training_graph import aten_training_graph
from sbplab.freeze import freeze
from sbplab.ops.aten.calls import call
from sbplab.ops.aten.opdef import counts_flops
from sbplab.ops.registry import get_op

tf = pytest.importorskip("transformers")


def _graph(kind: str) -> sl.compiler.ir.Graph:
    if kind == "gpt2":
        cfg = tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        cls = tf.GPT2LMHeadModel
    else:
        cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=64, max_position_embeddings=16, bos_token_id=0,
                             eos_token_id=0)
        cls = tf.LlamaForCausalLM
    with torch.device("meta"):
        model = cls(cfg).train()
        ids = torch.zeros(2, 8, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aten_training_graph(model, {"input_ids": ids, "labels": ids}, None, None, 1, sl.Adam(lr=1e-3))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def graph(request):
    return _graph(request.param)


def _counted(op, graph) -> int:
    """What FlopCounterMode counts for this op's call on meta tensors (the long way)."""
    metas = [graph.tensors[t].meta for t in op.inputs]
    with FlopCounterMode(display=False) as counter:
        call(op.type, op.attrs, [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in metas],
             torch.device("meta"))
    return int(counter.get_total_flops())


def test_flops_without_the_counter_equal_the_counters(graph):
    aten = [op for op in graph.ops if op.type.count(".") == 2]  # captured ops (optimizer ops are sbplab's)
    skipped = [op for op in aten if not counts_flops(op.type)]
    assert len(skipped) > len(aten) // 2  # most ops (pointwise, views, losses) skip the counter
    assert any(counts_flops(op.type) for op in aten)  # and the matmuls do not
    seen = set()
    for op in aten:
        metas = [graph.tensors[t].meta for t in op.inputs]
        key = (op.type, tuple(metas), freeze(op.attrs))
        if key in seen:  # identical calls (the two layers) ask the same question
            continue
        seen.add(key)
        reg = get_op(op.type)
        got = reg.flops(metas, reg.infer(metas, op.attrs), op.attrs)
        assert got == _counted(op, graph), op.name
    assert sum(_counted(op, graph) for op in aten if counts_flops(op.type)) > 0


def test_hints_on_a_few_names_find_what_a_full_scan_finds(graph):
    strategy = sl.presets.dp_tp((2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = strategy.match_report(graph)
    by_role = _by_role(graph)
    restricted = [m for m in report.matches if m.hint.only is not None]
    assert restricted and any(m.targets for m in restricted)
    for m in report.matches:
        h = m.hint
        if h.input_grad is not None:
            continue
        if any(c in h.pattern for c in "*?["):
            want = [n for n in by_role[h.role] if fnmatch.fnmatchcase(n, h.pattern) and (h.only is None or n in h.only)]
        else:
            t = graph.tensors.get(h.pattern)
            ok = t is not None and (h.role is None or t.role == h.role) and (h.only is None or h.pattern in h.only)
            want = [h.pattern] if ok else []
        assert m.targets == want, h.describe()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "zoo"])
def test_capture_without_export_gives_the_graph_export_gives(kind, monkeypatch):
    """AOTAutograd straight on a meta-device module (one trace) and torch.export then AOTAutograd (two) make
    the same graph: names, attributes, module paths, source lines, backward owners, parameters, gradients."""
    from sbplab.compiler.frontend import aten_capture
    from sbplab.compiler.frontend.aten_capture import capture_aten, through_export

    if kind == "zoo":
        torch.manual_seed(0)
        model = sl.models.GPT(sl.models.GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=32))
        (idx,), t = model.example_batch(2)
        model.to("meta")
        args, kwargs, loss_fn, targets = (idx.to("meta"),), {}, model.loss_fn, (t.to("meta"),)
    else:
        cfg = (tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                 embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0) if kind == "gpt2" else
               tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=64, max_position_embeddings=16, bos_token_id=0,
                                  eos_token_id=0))
        with torch.device("meta"):
            model = (tf.GPT2LMHeadModel if kind == "gpt2" else tf.LlamaForCausalLM)(cfg).train()
            ids = torch.zeros(2, 8, dtype=torch.int64)
        args, kwargs, loss_fn, targets = (), {"input_ids": ids, "labels": ids}, None, ()
    exported_route = aten_capture._joint_through_export

    def not_here(*a, **k):
        raise AssertionError("the direct route fell back to torch.export")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setattr(aten_capture, "_joint_through_export", not_here)
        direct, direct_grads = capture_aten(model, args, kwargs, loss_fn, targets)
        monkeypatch.setattr(aten_capture, "_joint_through_export", exported_route)
        with through_export():
            exported, exported_grads = capture_aten(model, args, kwargs, loss_fn, targets)
    assert any(o.module and o.source for o in direct.ops)  # module paths and source lines recorded
    assert _same_graph(direct) == _same_graph(exported)
    assert direct_grads == exported_grads


def _same_graph(g) -> tuple:
    ops = [(o.name, o.type, tuple(o.inputs), tuple(o.outputs), repr(sorted(o.attrs.items(), key=str)), o.phase,
            o.module, o.source, o.forward_op) for o in g.ops]
    tensors = [(t.name, t.meta.shape, t.meta.dtype, t.role, t.module) for t in g.tensors.values()]
    return ops, tensors, g.loss, dict(g.state_updates), list(g.params), list(g.inputs)


def test_one_tensor_given_as_two_inputs_stays_two_inputs():
    """``{"input_ids": x, "labels": x}`` (one tensor, a causal LM's usual call) on a model with real tensors:
    the embedding reads ``input_ids`` and the loss ``labels``, so a later batch whose labels differ feeds each
    where it belongs (traced as one tensor, every read went to ``labels``)."""
    from sbplab.compiler.frontend.aten_capture import capture_aten

    cfg = tf.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = tf.GPT2LMHeadModel(cfg).train()
    x = torch.randint(0, 64, (2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g, _ = capture_aten(model, (), {"input_ids": x, "labels": x})
    assert g.consumers("input_ids") and g.consumers("labels")  # each read (before: input_ids by nothing)
    assert not {op.name for op in g.consumers("input_ids")} & {op.name for op in g.consumers("labels")}
