"""What Megatron splits that a contiguous split cannot: fused QKV layers (a strided split, ``S(d, chunks=3)``),
the cross entropy on vocabulary shards, and sequence parallel's backward; collective counts per step by hand,
training against single-device torch on real workers, the strided layout against torch.

Hand counts, one training step on a 1-D tensor-parallel axis of 2 ranks, 2 transformer layers:

- forward: the vocabulary-parallel embedding's partial lookups (1 all-reduce), per layer the attention and
  MLP pairs' g (2 all-reduces), and Megatron's vocab-parallel cross entropy: the row max and the row sum of
  exponentials (2 all-reduces; Megatron's third, the target's logit, is the partial loss itself, reduced with
  the loss). 1 + 2 x 2 + 2 = 7 all-reduces, no all-gather: the logits are never gathered.
- backward: per layer the two pairs' f (the column inputs' gradients, q, k and v summed first: 2
  all-reduces), and the output layer's input gradient (1). 2 x 2 + 1 = 5 all-reduces. The cross entropy's
  backward (softmax minus the one-hot target) and the embedding's (each rank its rows) need none.
- sequence parallel (the zoo GPT, 5 norms with weight and bias): forward every all-reduce of the embedding
  and the rows becomes a reduce-scatter (5), each column input and the output layer's is all-gathered (4 +
  1) and the logits (1): 6 all-gathers. Backward: per layer 2 row outputs' gradients all-gathered and 2
  column inputs re-gathered for the weight gradients (Megatron re-gathers rather than keep them), 2 column
  input gradients reduce-scattered; the output layer likewise (1 all-gather, 1 reduce-scatter); the
  embedding's output gradient all-gathered (1); the norms' weight and bias gradients, computed on sequence
  shards, all-reduced (10). 4 x 2 + 1 + 1 = 10 all-gathers, 2 x 2 + 1 = 5 reduce-scatters, 10 all-reduces.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.layout import LayoutError, check_layout, random_shards, shard
from sbplab.models import GPT, GPTConfig, corpus
from sbplab.ops.aten.calls import Slot
from sbplab.ops.check import check_signature_numerics
from sbplab.ops.registry import TensorMeta, nd_signatures

LR = 0.05
MEGATRON = Counter({("forward", "all_reduce"): 7, ("backward", "all_reduce"): 5})


def _counts(step) -> Counter:
    return Counter((c.phase, c.kind) for c in step.physical.collectives)


# --- the strided split against torch -------------------------------------------------------------------

def _reference_piece(full: torch.Tensor, dim: int, chunks: int, parts: int, i: int) -> torch.Tensor:
    """Rank i's piece under S(dim, chunks): torch's own chunk and tensor_split (balanced, larger first)."""
    return torch.cat([c.tensor_split(parts, dim)[i] for c in full.chunk(chunks, dim)], dim)


MESHES = [[0, 1], [0, 1, 2], [[0, 1], [2, 3]], [[0, 1, 2], [3, 4, 5]]]


@settings(max_examples=40, deadline=None)
@given(mesh_i=st.integers(0, len(MESHES) - 1), data=st.data())
def test_strided_split_layout_is_torchs_chunks_each_split(mesh_i, data):
    mesh = sl.Placement("cpu", MESHES[mesh_i])
    chunks = data.draw(st.sampled_from([2, 3, 4]))
    dim = data.draw(st.integers(0, 1))
    shape = [data.draw(st.integers(3, 7)), data.draw(st.integers(3, 7))]
    shape[dim] = chunks * data.draw(st.integers(3, 5))  # each chunk at least as long as any axis
    axis = data.draw(st.integers(0, mesh.ndim - 1))
    other = [sl.B, sl.P, sl.S(1 - dim)]
    nd = tuple(sl.S(dim, chunks=chunks) if a == axis else data.draw(st.sampled_from(other)) for a in range(mesh.ndim))
    full = torch.randn(shape)
    shards = shard(full, mesh, nd)
    for r in mesh.rank_list:
        want = full
        for a, x in enumerate(nd):  # mesh axis 0 first, as n-D SBP nests
            c = mesh.coords(r)[a]
            if x == sl.S(dim, chunks=chunks):
                want = _reference_piece(want, dim, chunks, mesh.shape[a], c)
            elif isinstance(x, sl.Split):
                want = want.tensor_split(mesh.shape[a], x.dim)[c]
        if all(mesh.coords(r)[a] == 0 for a, x in enumerate(nd) if isinstance(x, sl.Partial)):
            torch.testing.assert_close(shards[r], want, atol=0, rtol=0)
        assert tuple(shards[r].shape) == sl.local_shape(tuple(shape), mesh, nd, r)
    assert torch.equal(sl.assemble(shards, mesh, nd), full)
    noisy = random_shards(full, mesh, nd, torch.Generator().manual_seed(1))  # honest partial addends
    torch.testing.assert_close(sl.assemble(noisy, mesh, nd), full)


def test_strided_split_text_and_errors():
    assert sl.parse_sbp("S(1, chunks=3), B") == (sl.S(1, chunks=3), sl.B)
    assert sl.parse_sbp(sl.fmt_sbp((sl.S(0, 3),))) == (sl.S(0, 3),) and sl.S(2, 1) == sl.S(2)
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    with pytest.raises(LayoutError, match="equal chunks"):
        check_layout((10, 4), mesh, (sl.S(0, chunks=3), sl.B), "w")
    with pytest.raises(LayoutError, match="only split of its dim"):
        check_layout((12, 4), mesh, (sl.S(0, chunks=3), sl.S(0)), "w")
    # boxing moves it (tests/test_boxing_strided.py): to B, an all-gather then the chunks put back in order
    pl = sl.Placement("cpu", 2)
    full = torch.arange(48.0).reshape(12, 4)
    plan = sl.plan_boxing((12, 4), "S(0, chunks=3)", "B", pl)
    assert [s.kind for s in plan.steps] == ["all_gather"]
    out = plan.run({r: _reference_piece(full, 0, 3, 2, r) for r in (0, 1)})
    assert all(torch.equal(out[r], full) for r in (0, 1))


def _attrs(*args) -> dict:
    return {"args": args, "kwargs": ()}


def test_fused_output_splits_into_q_k_v_and_back_on_shards():
    """The rules that carry a fused layer: the matmul making the strided output, the split into q, k, v
    (plain splits), the cat of their gradients back, each checked on shards against torch (every valid
    signature on 2 ranks, the strided ones among them)."""
    mesh = sl.Placement("cpu", 2)
    g = torch.Generator().manual_seed(0)
    x, w, y = torch.randn(8, 4, generator=g), torch.randn(4, 12, generator=g), torch.randn(2, 5, 12, generator=g)
    strided = (sl.S(2, chunks=3),)
    cases = [("aten.mm.default", (x, w), _attrs(Slot(0), Slot(1))),
             ("aten.split.Tensor", (y,), _attrs(Slot(0), 4, 2)),
             ("aten.cat.default", tuple(y.split(4, 2)), _attrs((Slot(0), Slot(1), Slot(2)), 2))]
    for name, xs, attrs in cases:
        sigs = nd_signatures(name, [TensorMeta.of(t) for t in xs], attrs, mesh)
        assert any(any(getattr(s[0], "chunks", 1) == 3 for s in (*sig.inputs, *sig.outputs)) for sig in sigs), name
        assert check_signature_numerics(name, xs, attrs, mesh, gen=g) == len(sigs)
    split = nd_signatures("aten.split.Tensor", [TensorMeta.of(y)], _attrs(Slot(0), 4, 2), mesh)
    assert any(s.inputs == (strided,) and s.outputs == ((sl.S(2),),) * 3 for s in split)


def test_target_logit_pick_on_vocabulary_shards():
    """The cross entropy's masked pick of each target's logit and its backward, on shards against torch's
    gather and scatter (every valid signature on 2 ranks: vocabulary split -> partial, batch split)."""
    mesh = sl.Placement("cpu", 2)
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(6, 10, generator=g), torch.tensor([0, 9, 4, 5, -100, 7])
    grad = torch.randn(6, generator=g)
    pick = lambda x, t: torch.where(t >= 0, x.gather(1, t.clamp(min=0)[:, None])[:, 0], 0.0)  # noqa: E731
    scatter = lambda d, t: torch.zeros(6, 10).scatter(1, t.clamp(min=0)[:, None], torch.where(t >= 0, d, 0.0)[:, None])  # noqa: E731
    n = check_signature_numerics("sbplab.pick_logit.default", (logits, target), _attrs(Slot(0), Slot(1)), mesh,
                                 gen=g, reference=pick)
    m = check_signature_numerics("sbplab.pick_logit_backward.default", (grad, target), _attrs(Slot(0), Slot(1), 10),
                                 mesh, gen=g, reference=scatter)
    assert n >= 3 and m >= 3  # vocabulary split, batch split, partial (and all-B)


# --- tensor parallel on real models: collective counts and training ------------------------------------

def _tp(n: int, **kw) -> sl.Strategy:
    return sl.Strategy(sl.mesh(tp=n), [sl.TensorParallel("tp", **kw)], name=f"tensor parallel x{n}")


_STEPS: dict = {}


def _corpus(name: str):
    if name not in _STEPS:
        built = corpus.build(name)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", sl.TensorParallelWarning)
            warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
            step = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                              optimizer=sl.SGD(lr=LR), strategy=_tp(2))
        _STEPS[name] = built, step, [str(w.message) for w in said if w.category is sl.TensorParallelWarning]
    return _STEPS[name]


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


@pytest.mark.parametrize("name,fused", [("nanogpt", "h.0.c_attn.weight"), ("gpt2", "transformer.h.0.attn.c_attn.weight"),
                                        ("llama", None)])
def test_tensor_parallel_issues_megatrons_collectives(name, fused):
    """nanoGPT (fused QKV nn.Linear, tied embedding), GPT-2 (fused QKV Conv1D, stored (in, out)) and a
    grouped-query Llama (4 query heads, 2 KV heads, separate q, k, v): attention, MLP, embedding and output
    layer all split, Megatron's counts (module docstring) and nothing left whole."""
    pytest.importorskip("transformers")
    _, step, said = _corpus(name)
    assert _counts(step) == MEGATRON
    assert not said
    sbp = step.deduction.sbp
    if fused is not None:  # an nn.Linear's weight (3C, C) strided on dim 0, a Conv1D's (C, 3C) on dim 1
        assert sbp[fused] == (sl.S(1 if name == "gpt2" else 0, chunks=3),)
    else:
        assert sbp["model.layers.0.self_attn.k_proj.weight"] == (sl.S(0),)
    text = step.strategy.report.text()
    assert "over the vocabulary: split, its logits split by vocabulary into the cross entropy" in text


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["nanogpt", "gpt2", "llama"])
def test_tensor_parallel_trains_like_torch(cluster, name):
    pytest.importorskip("transformers")
    built, step, _ = _corpus(name)
    result = cluster.run(step, built.feeds(), steps=2)
    want, trained = built.train_torch(2, lambda ps: torch.optim.SGD(ps, lr=LR))
    assert result.losses == pytest.approx(want, abs=2e-5)
    got, ref = result.full_params(), dict(trained.named_parameters())
    for k in [k for k in got if "c_attn.weight" in k or "lm_head" in k or "q_proj" in k][:3]:
        torch.testing.assert_close(got[k], ref[k].detach(), atol=2e-5, rtol=1e-4)


def test_sequence_parallel_backward_is_megatrons():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4))
    (idx,), targets = model.example_batch(4)
    step = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets, optimizer=sl.SGD(lr=LR),
                      strategy=_tp(2, sequence_parallel=True))
    assert _counts(step) == Counter({("forward", "reduce_scatter"): 5, ("forward", "all_gather"): 6,
                                     ("backward", "all_gather"): 10, ("backward", "reduce_scatter"): 5,
                                     ("backward", "all_reduce"): 10})
    norms = [c for c in step.physical.collectives if c.phase == "backward" and c.kind == "all_reduce"]
    assert all("ln_" in step.deduction.boxings[c.boxing].tensor for c in norms)  # only the norms' parameters
