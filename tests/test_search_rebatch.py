"""The search's micro-batch graphs derived from one ATen capture (``search/rebatch.py``) are the graphs a
direct capture at the micro-batch gives, node for node; where the rules cannot derive one, the model is
captured again and the graph is still the direct one."""

from __future__ import annotations

import warnings

import pytest
import torch

import sbplab as sl
from sbplab.compiler.ir import Graph
from sbplab.compiler.training.optim import as_optimizer
from sbplab.compiler.training.training_graph import trace_training_graph
from sbplab.search.rebatch import rebatch
from sbplab.search.search_api import Space

tf = pytest.importorskip("transformers")


def _same(a: Graph, b: Graph) -> None:
    assert [o.name for o in a.ops] == [o.name for o in b.ops]
    for x, y in zip(a.ops, b.ops):
        assert (x.type, x.inputs, x.outputs, x.phase, x.forward_op) == (y.type, y.inputs, y.outputs, y.phase,
                                                                         y.forward_op), x.name
        assert _attrs(x.attrs) == _attrs(y.attrs), (x.name, x.attrs, y.attrs)
    assert a.tensors.keys() == b.tensors.keys()
    for n, t in a.tensors.items():
        u = b.tensors[n]
        assert (t.meta, t.role, t.producer) == (u.meta, u.role, u.producer), n
    assert (a.inputs, a.params, a.grads, a.state_updates, a.loss, a.micro_batches) == \
        (b.inputs, b.params, b.grads, b.state_updates, b.loss, b.micro_batches)


def _floats_masked(v):
    if isinstance(v, float):
        return float
    if isinstance(v, (tuple, list)):
        return type(v)(_floats_masked(x) for x in v)
    return v


def _attrs(attrs: dict) -> dict:
    """A random op's stream without the compile's serial number (each trace takes the next), and floats
    masked: a scalar the batch set (mse's 2/B in torch's backward) keeps the whole batch's value in a
    derived graph, whose values the search never reads (prices and the simulator read shapes)."""
    s = attrs.get("stream")
    out = {k: _floats_masked(v) for k, v in attrs.items() if k != "stream"}
    return out if s is None else {**out, "stream": (s[0], s[2])}


def _gpt2():
    warnings.simplefilter("ignore")
    cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=96, n_positions=16, bos_token_id=0,
                        eos_token_id=0)
    with torch.device("meta"):
        return tf.GPT2LMHeadModel(cfg)


def test_micro_batch_graphs_derived_from_one_capture_are_the_direct_captures():
    m = _gpt2()
    x = torch.zeros(8, 16, dtype=torch.int64)
    inputs = {"input_ids": x, "labels": x}
    opt = as_optimizer(sl.Adam())
    space = Space(m, inputs, None, None, opt, sl.Hardware.h100_node())
    space.graph(1)
    for k, mb in enumerate((2, 4, 8)):  # micro-batches of 4, 2 and 1 samples
        derived = space.graph(mb)
        # derived, but not for one sample: torch specializes a size-1 dim (that capture has other ops); the
        # capture, not the training graph of 2 micro-batches, whose 4 samples are also its 4 heads (ambiguous)
        assert (space.captures.derived, space.rebatched) == ((1, 0), (2, 0), (2, 0))[k]
        with torch.device("meta"):
            direct = trace_training_graph(m, inputs, None, None, mb, opt)
        _same(derived, direct)
        assert derived.tensors["input_ids"].shape == (8 // mb, 16)


class _BatchSecond(torch.nn.Module):
    """Puts the batch on dim 1 midway (its backward views a transposed gradient: no rule derives that)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, 6)
        h = self.fc(x).transpose(0, 1)  # (T, B, 6)
        return h.sum(dim=(0, 2))  # (B,)


def test_a_graph_the_rules_cannot_derive_is_captured_again():
    m = _BatchSecond()
    x, y = torch.randn(4, 3, 6), torch.randn(4)
    opt = as_optimizer(None)
    space = Space(m, (x,), torch.nn.functional.mse_loss, y, opt, sl.Hardware.cpu_box(), capture="aten")
    space.graph(1)
    half = space.graph(2)
    assert space.captures.derived == 0  # refused: captured again
    direct = trace_training_graph(m, (x,), torch.nn.functional.mse_loss, y, 2, opt, capture="aten")
    _same(half, direct)
    b, g, grads, _ = space.captures.whole
    assert rebatch(g, grads, b, 3) is None  # 3 samples do not divide 4
    assert rebatch(g, grads, b, 1) is None  # one sample: torch's size-1 specialization, captured instead
    assert rebatch(g, grads, b, 2) is None and rebatch(g, grads, b, 4).tensors.keys() == g.tensors.keys()


class _Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 6)
        return self.fc(x).sum(dim=(1, 2))  # (B,)


class _Rows(torch.nn.Module):
    """Flattens the batch into rows (B x 3) and has a weight with a dim of 12, the rows of 4 samples."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 6)
        rows = self.fc(x.reshape(-1, 6))  # (B * 3, 12)
        return rows.reshape(x.shape[0], -1).sum(dim=1)  # (B,)


# _Plain: at 6 the features have the batch's size too; _Rows: 4 x 3 rows = the weight's 12 (a size could be
# either); where it could, the graph is captured again instead of derived
@pytest.mark.parametrize("model, batch, derived", [(_Plain, 4, 1), (_Plain, 6, 0), (_Rows, 4, 0), (_Rows, 8, 1)])
def test_a_graph_with_another_dim_of_the_batchs_size_is_captured_again(model, batch, derived):
    m = model()
    x, y = torch.randn(batch, 3, 6), torch.randn(batch)
    opt = as_optimizer(None)
    space = Space(m, (x,), torch.nn.functional.mse_loss, y, opt, sl.Hardware.cpu_box(), capture="aten")
    space.graph(1)
    half = space.graph(2)
    assert space.captures.derived == derived
    _same(half, trace_training_graph(m, (x,), torch.nn.functional.mse_loss, y, 2, opt, capture="aten"))


def test_training_graphs_derived_from_another_micro_batch_count_are_the_traced_ones():
    """torch.fx onto sbplab's ops (no ATen capture to derive): the graph of 4 and 8 micro-batches comes from
    the one of 2 (the same accumulation and update ops), node for node the traced one; one sample is traced."""
    torch.manual_seed(0)
    # sizes no product of the batch meets (rows of 8 x 12 tokens are no weight's dim, no dim is 8 samples)
    m = sl.models.GPT(sl.models.GPTConfig(vocab_size=64, block_size=12, n_layer=2, n_head=2, n_embd=40))
    (idx,), y = m.example_batch(16)
    opt = as_optimizer(sl.Adam())
    space = Space(m, (idx,), m.loss_fn, y, opt, sl.Hardware.h100_node())
    for k, mb in enumerate((1, 2, 4, 8, 16)):  # 16 to 1 samples a micro-batch
        got = space.graph(mb)
        assert space.captures.whole is None and space.rebatched == (0, 0, 1, 2, 2)[k]
        with torch.device("meta"):
            _same(got, trace_training_graph(m, (idx,), m.loss_fn, y, mb, opt))
        assert got.tensors["idx"].shape == (16 // mb, 12) and got.micro_batches == mb
