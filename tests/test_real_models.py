"""Real models nobody here wrote (transformers GPT-2, Llama, BERT, ViT, ResNet, Mixtral; a nanoGPT-style
model; an LSTM) captured at ATen level and trained on real workers: every loss and every final
parameter equals plain single-device torch.

Tensor parallel finds its Megatron pairs from each captured graph's structure (the preset's default
globs name no layer of these models): a layer with a weight whose input is not split is a column
candidate, one that reads a column's split on its contracted dim a row, and every op between them
must keep the split (see ``compiler/deduction/megatron.py``). The corpus's tensor-parallel strategies
also split the embedding and the output layer over the vocabulary (``vocab=True``).

BatchNorm (ResNet) is synchronised: its statistics are sums over the whole batch, so data parallel,
ZeRO and DP x TP equal one device; with micro-batches (the pipeline) each micro-batch has its own
statistics, as gradient accumulation in torch gives, and the reference accumulates the same way.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sbplab as sl
from sbplab.models import corpus

pytest.importorskip("transformers")

STRATEGIES = corpus.strategies()
LR = 0.05


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(4) as c:
        yield c


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("name", corpus.MODELS)
def test_real_model_trains_like_torch(cluster, name, strategy):
    built = corpus.build(name)
    st = STRATEGIES[strategy]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)  # Mixtral's routing runs whole (tested below)
        step = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                          optimizer=sl.SGD(lr=LR, momentum=0.9), strategy=st)
    assert step.graph.micro_batches == st.micro_batches
    result = cluster.run(step, built.feeds(), steps=3)
    want, trained = built.train_torch(3, lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9), st.micro_batches)
    assert result.losses == pytest.approx(want, abs=2e-5), (result.losses, want)
    got = result.full_params()
    seen = set()
    for fqn, p in trained.named_parameters():  # tied weights appear once, under their first name
        if id(p) in seen:
            continue
        seen.add(id(p))
        torch.testing.assert_close(got[fqn], p.detach(), atol=2e-5, rtol=1e-4, msg=lambda m, fqn=fqn: f"{fqn}: {m}")


def _pairs(name: str) -> tuple[list[str], list[str], sl.Compiled]:
    built = corpus.build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
        step = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                          strategy=sl.presets.tensor_parallel(2))
    lines = [ln.strip() for ln in str(step.strategy.report).splitlines() if "paired [" in ln]
    return [ln for ln in lines if ln.startswith("paired")], [ln for ln in lines if ln.startswith("not paired")], step


def _forward_all_reduces(step) -> int:
    return sum(1 for c in step.physical.collectives if c.phase == "forward" and c.kind == "all_reduce")


def test_tensor_parallel_splits_llama_like_megatron():
    """Llama (separate q, k, v with grouped-query heads, RoPE, SwiGLU): per layer one attention pair
    (q, k, v -> o) and one MLP pair (gate, up -> down), one forward all-reduce each, as Megatron; the
    preset splits the vocabulary too (its loss runs on vocabulary shards): + the embedding's all-reduce
    and the cross entropy's row max and sum of exponentials."""
    paired, _, step = _pairs("llama")
    assert len(paired) == 4
    assert sum("q_proj" in p and "k_proj" in p and "v_proj" in p and "o_proj" in p for p in paired) == 2
    assert sum("gate_proj" in p and "up_proj" in p and "down_proj" in p for p in paired) == 2
    assert _forward_all_reduces(step) == 4 + 1 + 2
    assert step.deduction.sbp["lm_head.weight"] == (sl.S(0),)
    sbp = step.deduction.sbp
    assert sbp["model.layers.0.self_attn.q_proj.weight"] == (sl.S(0),)  # (out, in): split by output features
    assert sbp["model.layers.0.self_attn.o_proj.weight"] == (sl.S(1),)


def test_tensor_parallel_splits_fused_qkv_per_head():
    """GPT-2's fused c_attn, split into q, k, v, pairs with c_proj through a strided split (each rank its
    heads of q, of k and of v); its Conv1D MLP (weights stored (in, out)) pairs too."""
    paired, broken, step = _pairs("gpt2")
    assert len(paired) == 4 and sum("attn.c_attn" in p and "attn.c_proj" in p for p in paired) == 2
    assert not any("c_attn" in b for b in broken)  # (lm_head is no pair: it splits over the vocabulary alone)
    assert step.deduction.sbp["transformer.h.0.mlp.c_fc.weight"] == (sl.S(1),)  # Conv1D: (in, out)
    assert step.deduction.sbp["transformer.h.0.attn.c_attn.weight"] == (sl.S(1, chunks=3),)
    assert _forward_all_reduces(step) == 4 + 1 + 2  # the pairs, the embedding, the cross entropy


def test_tensor_parallel_that_splits_nothing_says_so():
    built = corpus.build("lstm")  # its weights are read by the LSTM's cell ops, never by a layer's matmul
    with pytest.warns(sl.TensorParallelWarning, match="split nothing"):
        sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                   strategy=sl.presets.tensor_parallel(2))
