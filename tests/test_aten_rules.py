"""Every SBP rule of the ATen families, checked on shards against torch for every op instance the
real-model corpus captures: for each 1-D signature a rule gives (on 2 ranks, and products on a 2x2
mesh), the ATen op run on each rank's shards with its localised arguments assembles to what torch
computes on the whole tensors. Partial inputs get random addends (``random_shards``), so a rule that
wrongly passes P through a non-linear op fails."""

from __future__ import annotations

import pytest
import torch

from sbplab.layout import assemble, random_shards
from sbplab.models import corpus
from sbplab.ops.aten import rule_for
from sbplab.ops.registry import NdSignature, get_op, nd_signatures, one_d_signatures, run_local
from sbplab.placement import Placement

pytest.importorskip("transformers")

INSTANCES = corpus.op_instances()


def _value(meta, gen: torch.Generator) -> torch.Tensor:
    if meta.dtype.is_floating_point:
        return torch.randn(meta.shape, generator=gen).to(meta.dtype)
    if meta.dtype == torch.bool:
        return torch.rand(meta.shape, generator=gen) > 0.3
    return torch.zeros(meta.shape, dtype=meta.dtype)  # indices and targets: 0 is valid for every op


def _check(name: str, metas: tuple, attrs: dict, placement: Placement, sig: NdSignature, gen) -> None:
    op = get_op(name)
    xs = [_value(m, gen) for m in metas]
    want = op.kernel(xs, attrs)
    shards = [random_shards(x, placement, s, gen) for x, s in zip(xs, sig.inputs)]
    outs = {r: run_local(op, [s[r] for s in shards], attrs, metas, sig, placement, r) for r in placement.rank_list}
    for j, (w, nd) in enumerate(zip(want, sig.outputs)):
        if w.numel() == 0:
            continue
        got = assemble({r: o[j] for r, o in outs.items()}, placement, nd)
        tol = dict(atol=1e-3, rtol=1e-3) if w.dtype.is_floating_point else dict(atol=0, rtol=0)
        torch.testing.assert_close(got, w, **tol, equal_nan=True, msg=lambda m, j=j: f"{name} {sig} output {j}: {m}")


def test_the_corpus_has_the_families():
    families = {rule_for(n).family for n, *_ in INSTANCES}
    assert {"pointwise", "reduction", "shape", "matmul", "norm", "attention", "embedding", "conv", "pooling",
            "factory", "along-dim", "indexing"} <= families, families
    assert len({n for n, *_ in INSTANCES}) >= 70


@pytest.mark.parametrize("name,metas,attrs,model", INSTANCES, ids=[f"{i[3]}-{i[0][5:]}-{k}" for k, i in enumerate(INSTANCES)])
def test_rule_is_exact_on_shards(name, metas, attrs, model):
    op = get_op(name)
    gen = torch.Generator().manual_seed(0)
    line = Placement("cpu", [0, 1])
    ones = one_d_signatures(op, metas, attrs)
    for s in ones:
        nd = NdSignature(tuple((x,) for x in s.inputs), tuple((x,) for x in s.outputs))
        if nd in nd_signatures(op, metas, attrs, line):  # the registry keeps those whose shards fit
            _check(name, metas, attrs, line, nd, gen)
    square = Placement("cpu", [[0, 1], [2, 3]])
    for nd in nd_signatures(op, metas, attrs, square)[1:4]:  # a few 2-D products
        _check(name, metas, attrs, square, nd, gen)


@pytest.mark.parametrize("name", ["aten.triu.default", "aten.tril.default"])
def test_triangle_masks_split_leading_dims_and_pass_partial(name):
    """A causal mask's triu/tril (not in the corpus: its models mask inside SDPA) keeps rows and columns
    whole; each of its signatures is exact on shards, partial input included."""
    from sbplab.ops.aten.calls import Slot
    from sbplab.ops.registry import TensorMeta

    metas = (TensorMeta((2, 4, 6, 6), torch.float32),)
    attrs = {"args": (Slot(0), 1), "kwargs": ()}
    op = get_op(name)
    ones = one_d_signatures(op, metas, attrs)
    assert {str(s) for s in ones} >= {"S(0) -> S(0)", "S(1) -> S(1)", "P -> P"}, ones
    assert not any("S(2)" in str(s) or "S(3)" in str(s) for s in ones), ones
    test_rule_is_exact_on_shards(name, metas, attrs, "mask")
