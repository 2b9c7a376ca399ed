"""Tensor parallel from the graph's structure: what it splits, the collectives Megatron would issue
(counted by hand in each test), training equal to single-device torch on real workers, and what it says
it could not split.

Hand counts, one training step, a 1-D tensor-parallel axis, no data parallel:

- Megatron, per column/row pair: one all-reduce forward (g, after the row layer) and one backward (f, the
  column input's gradient). A GPT block has two pairs (attention, MLP).
- VocabParallelEmbedding: one all-reduce forward (the partial lookups); none backward (each rank's rows'
  gradient is computed from the whole output gradient it already has).
- The output layer over the vocabulary with its logits gathered for the loss (``gather_output``): one
  all-gather forward, one all-reduce backward (its input's gradient).
- Sequence parallel (Korthikanti et al.): every forward all-reduce becomes a reduce-scatter over the
  sequence, and each column layer's input (and the output layer's) is all-gathered first.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

import sbplab as sl
from sbplab.models import GPT, GPTConfig, corpus

LR = 0.05


def _tp(n: int, **kw) -> sl.Strategy:
    return sl.Strategy(sl.mesh(tp=n), [sl.TensorParallel("tp", **kw)], name=f"tensor parallel x{n}")


def _counts(step) -> Counter:
    return Counter((c.phase, c.kind) for c in step.physical.collectives)


def _gpt(n_head: int = 4):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=n_head))
    (idx,), targets = model.example_batch(4)
    return model, idx, targets


def _compile_gpt(strategy, n_head: int = 4):
    model, idx, targets = _gpt(n_head)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", sl.TensorParallelWarning)
        step = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets, optimizer=sl.SGD(lr=LR),
                          strategy=strategy)
    return step, (model, idx, targets), [str(w.message) for w in said if w.category is sl.TensorParallelWarning]


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(4) as c:
        yield c


def test_zoo_gpt_splits_attention_mlp_embedding_and_output_layer():
    step, _, said = _compile_gpt(_tp(2))
    sbp = step.deduction.sbp
    assert sbp["blocks.0.attn.q.weight"] == (sl.S(0),) and sbp["blocks.0.attn.proj.weight"] == (sl.S(1),)
    assert sbp["blocks.1.mlp.fc1.weight"] == (sl.S(0),) and sbp["blocks.1.mlp.fc2.weight"] == (sl.S(1),)
    assert sbp["wte.weight"] == (sl.S(0),)  # vocabulary rows split
    assert sbp["lm_head.weight"] == (sl.S(0),)  # (vocab, C): split by vocabulary
    assert sbp["wpe.weight"] == (sl.B,)  # a position table is no vocabulary
    # by hand: forward 1 (embedding) + 2 layers x 2 pairs = 5 all-reduces, 1 all-gather (logits);
    # backward 2 x 2 (f) + 1 (output layer's input) = 5 all-reduces; nothing else
    assert _counts(step) == Counter({("forward", "all_reduce"): 5, ("forward", "all_gather"): 1,
                                     ("backward", "all_reduce"): 5})
    text = step.strategy.report.text()
    assert "embedding wte over the vocabulary: split" in text and "output layer lm_head over the vocabulary: split" in text
    assert "embedding wpe over the vocabulary: kept whole: its ids are computed" in text
    assert not said  # nothing it could have split was left whole


@pytest.mark.multiprocess
def test_zoo_gpt_tensor_and_sequence_parallel_train_like_torch(cluster):
    plain, (model, idx, targets), _ = _compile_gpt(_tp(2))
    seq, _, _ = _compile_gpt(_tp(2, sequence_parallel=True))
    # by hand, forward: the 5 all-reduces become 5 reduce-scatters; 4 column inputs and the output layer's
    # input are all-gathered, plus the logits: 6 all-gathers; no all-reduce
    fwd = Counter({k: v for k, v in _counts(seq).items() if k[0] == "forward"})
    assert fwd == Counter({("forward", "reduce_scatter"): 5, ("forward", "all_gather"): 6})
    assert ("backward", "all_to_all") not in _counts(seq)  # row outputs' gradients gathered, not re-split
    assert seq.deduction.sbp["blocks.0.ln_2.weight"] == (sl.B,)
    want, params = sl.torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=LR), steps=2)
    for step in (plain, seq):
        result = cluster.run(step, (idx, targets), steps=2)
        assert result.losses == pytest.approx(want, abs=2e-5)
        got = result.full_params()
        for name in ("wte.weight", "lm_head.weight", "blocks.1.attn.q.weight", "blocks.1.ln_1.weight"):
            torch.testing.assert_close(got[name], params[name], atol=2e-5, rtol=1e-4)


def test_heads_that_do_not_divide_are_said():
    step, _, said = _compile_gpt(_tp(4), n_head=2)  # 2 heads over 4 ranks
    text = step.strategy.report.text()
    assert "2 heads do not divide over 4 tensor-parallel ranks" in text
    assert step.deduction.sbp["blocks.0.attn.q.weight"] == (sl.B,)  # attention stays whole, said
    assert step.deduction.sbp["blocks.0.mlp.fc1.weight"] == (sl.S(0),)  # the MLP still pairs
    assert any("blocks.0.attn.q" in w and "heads do not divide" in w for w in said)


def _corpus(name: str, tp: int):
    built = corpus.build(name)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", sl.TensorParallelWarning)
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
        step = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                          optimizer=sl.SGD(lr=LR), strategy=_tp(tp))
    return built, step, [str(w.message) for w in said if w.category is sl.TensorParallelWarning]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_grouped_query_attention_keeps_kv_heads_whole_and_splits_the_rest(cluster):
    """Llama with 4 query heads and 2 KV heads on 4 ranks: the KV heads do not divide, so K and V stay whole
    (read split by slicing, as Megatron replicates KV heads) and the query heads, o_proj, the MLP and the
    output layer split, and the (ATen) embedding over the vocabulary. By hand, forward: 2 layers x 2 pairs
    + the embedding + the vocab-parallel cross entropy's row max and sum of exponentials = 7 all-reduces, no
    all-gather (the logits stay split)."""
    built, step, said = _corpus("llama", 4)
    sbp = step.deduction.sbp
    assert sbp["model.layers.0.self_attn.q_proj.weight"] == (sl.S(0),)
    assert sbp["model.layers.0.self_attn.o_proj.weight"] == (sl.S(1),)
    assert sbp["model.layers.0.self_attn.k_proj.weight"] == (sl.B,)
    assert sbp["lm_head.weight"] == (sl.S(0),) and sbp["model.embed_tokens.weight"] == (sl.S(0),)
    fwd = Counter({k: v for k, v in _counts(step).items() if k[0] == "forward"})
    assert fwd == Counter({("forward", "all_reduce"): 7})
    text = step.strategy.report.text()
    assert "k_proj.mm kept whole (replicated over the tensor-parallel axis)" in text
    assert "2 heads do not divide over 4 tensor-parallel ranks" in text
    assert len(said) == 1 and "k_proj kept whole" in said[0] and "embed_tokens" not in said[0]
    result = cluster.run(step, built.feeds(), steps=2)
    want, _ = built.train_torch(2, lambda ps: torch.optim.SGD(ps, lr=LR))
    assert result.losses == pytest.approx(want, abs=2e-5)


@pytest.mark.multiprocess
def test_nanogpt_fused_qkv_splits_per_head(cluster):
    """nanoGPT: the fused QKV (c_attn, its output split into q, k, v) is split per head of each (a strided
    split, S(0, chunks=3) of its (3C, C) weight), the MLP pairs, and the tied embedding/output layer over
    the vocabulary. By hand, forward: 2 layers x 2 pairs + the embedding + the cross entropy's row max and
    sum of exponentials = 7 all-reduces, no all-gather (the logits stay split)."""
    built, step, said = _corpus("nanogpt", 2)
    sbp = step.deduction.sbp
    assert sbp["h.0.mlp.0.weight"] == (sl.S(0),) and sbp["h.0.c_attn.weight"] == (sl.S(0, chunks=3),)
    assert sbp["wte.weight"] == (sl.S(0),)  # read by the embedding and, tied, by the output layer
    assert not said
    assert Counter({k: v for k, v in _counts(step).items() if k[0] == "forward"}) == \
        Counter({("forward", "all_reduce"): 7})
    result = cluster.run(step, built.feeds(), steps=2)
    want, _ = built.train_torch(2, lambda ps: torch.optim.SGD(ps, lr=LR))
    assert result.losses == pytest.approx(want, abs=2e-5)
