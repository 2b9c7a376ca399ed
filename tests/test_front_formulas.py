"""Deduction's formulas give what running torch gives, on transformers' GPT-2 and Llama (small, meta device):

- FLOPs by formula (``ops/aten/flop_formulas.py``: the counter's own formula read on shapes, zero for
  pointwise ops) equal ``torch.utils.flop_counter``'s count of the call, for every op of the captured
  graphs, on its global shapes and on every rank's shards under every n-D signature of a 2x2 mesh;
  convolutions, batched matmuls and ATen's SDPA (not in these graphs) on a few shapes;
- output shapes by formula (``ops/aten/shape_formulas.py``: broadcasting, mm, views, transpose,
  unsqueeze, expand, sum) equal the meta kernel's, dtypes included, for every op of those graphs on every
  rank's shards under every product of its 1-D signatures on a 2x2 mesh (the candidates listing
  checks, the invalid ones too: where torch refuses a call the formula gives no answer);
- a boxing priced from the planner's route without making the plan costs what the plan says;
- a deduction with every formula turned off (each op's FLOPs counted by the counter, each shape
  inferred by a meta kernel) is the same deduction, signature for signature and boxing for boxing.
"""

from __future__ import annotations

import itertools
import warnings
from collections import Counter

import pytest
import torch
from tiny_hf import tiny_hf_training_graph
from torch.utils.flop_counter import FlopCounterMode

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.compiler.deduction.deduce import deduce, route_cost
from sbplab.errors import SbplabError
from sbplab.freeze import freeze, freeze_attrs
from sbplab.layout import local_block
from sbplab.ops.aten import opdef
from sbplab.ops.aten.calls import Slot, call, overload
from sbplab.ops.aten.flop_formulas import counted_by_torch, formula_flops
from sbplab.ops.aten.rules import rule_for
from sbplab.ops.aten.shape_formulas import BROADCAST, kernels_only, output_shapes
from sbplab.ops.choose import BoxingCost
from sbplab.ops.registry import (
    LocalContext,
    NdSignature,
    TensorMeta,
    forget_cached_answers,
    get_op,
    local_context,
    nd_signatures,
    one_d_signatures,
)
from sbplab.sbp import B, P, S

pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def graph(request):
    return tiny_hf_training_graph(request.param, 3)


def _counted(name: str, metas, attrs: dict) -> int:
    with FlopCounterMode(display=False) as counter:
        call(name, attrs, [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in metas], torch.device("meta"))
    return int(counter.get_total_flops())


def _by_formula(name: str, metas, attrs: dict) -> int | None:
    target = attrs.get("op", name)
    return formula_flops(target, rule_for(target).family, metas, attrs, lambda: get_op(name).infer(metas, attrs))


def test_flop_formulas_equal_the_counter_on_every_shard(graph):
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    seen, checked, nonzero = set(), 0, 0
    for op in graph.ops:
        if op.type.count(".") != 2:  # the optimizer's ops are sbplab's own
            continue
        metas = [graph.tensors[t].meta for t in op.inputs]
        key = (op.type, tuple(metas), freeze(op.attrs))
        if key in seen:
            continue
        seen.add(key)
        reg = get_op(op.type)
        cases = [(metas, op.attrs)]
        for sig in nd_signatures(reg, metas, op.attrs, mesh):
            ctx = local_context(reg, metas, op.attrs, sig, mesh, 0)
            local = [TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ctx.in_blocks, metas)]
            cases.append((local, reg.localize(dict(op.attrs), ctx)))
        for ms, attrs in cases:
            got = _by_formula(op.type, ms, attrs)
            if got is None:
                continue
            want = _counted(op.type, ms, attrs)
            assert got == want, (op.name, op.type, ms)
            checked += 1
            nonzero += want > 0
    assert checked > 100 and nonzero > 10  # matmuls and attention on many shards, pointwise ops too


@pytest.mark.parametrize("name, shapes, args", [
    ("aten.bmm.default", [(3, 4, 5), (3, 5, 6)], (Slot(0), Slot(1))),
    ("aten.baddbmm.default", [(3, 4, 6), (3, 4, 5), (3, 5, 6)], (Slot(0), Slot(1), Slot(2))),
    ("aten.addmm.default", [(6,), (4, 5), (5, 6)], (Slot(0), Slot(1), Slot(2))),
    ("aten.convolution.default", [(2, 3, 9, 9), (8, 3, 3, 3), (8,)],
     (Slot(0), Slot(1), Slot(2), (2, 2), (1, 1), (1, 1), False, (0, 0), 1)),
    ("aten.convolution.default", [(2, 4, 7, 7), (4, 2, 3, 3), (4,)],
     (Slot(0), Slot(1), Slot(2), (1, 1), (0, 0), (1, 1), False, (0, 0), 2)),
    ("aten._scaled_dot_product_efficient_attention.default", [(2, 4, 8, 16)] * 3,
     (Slot(0), Slot(1), Slot(2), None, True)),
])
def test_flop_formulas_of_ops_the_models_lack(name, shapes, args):
    metas = [TensorMeta(s) for s in shapes]
    attrs = {"args": args}
    got = _by_formula(name, metas, attrs)
    assert got is not None and got == _counted(name, metas, attrs) > 0


def test_deduction_with_the_counter_equals_the_formulas(graph):
    strategy = sl.presets.dp_tp((2, 2))

    def record():
        forget_cached_answers()  # signatures, FLOPs per shard, scores, plans: each deduction answers anew
        opdef._flops.cache_clear()
        opdef._infer.cache_clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = deduce(graph, strategy)
        return ({k: (c.signature, c.cost, tuple(c.reads), c.reason, tuple(c.rejected)) for k, c in d.choices.items()},
                [(b.tensor, b.src_sbp, b.dst_sbp, b.plan, tuple(b.consumers)) for b in d.boxings])

    fast = record()
    with counted_by_torch(), kernels_only():
        slow = record()
    assert fast == slow
    assert len(fast[0]) == len(graph.ops)


def _shards(reg, metas, attrs, mesh):
    """(local input metas, local attrs) of every rank under every product of the op's 1-D signatures."""
    outs = reg.infer(metas, attrs)
    ones = one_d_signatures(reg, metas, attrs)
    for combo in itertools.product(ones, repeat=2):
        sig = NdSignature(tuple(tuple(c.inputs[i] for c in combo) for i in range(len(metas))),
                          tuple(tuple(c.outputs[j] for c in combo) for j in range(len(outs))))
        for rank in mesh.rank_list:
            try:
                ib = tuple(local_block(m.shape, mesh, nd, rank) for m, nd in zip(metas, sig.inputs))
                ob = tuple(local_block(m.shape, mesh, nd, rank) for m, nd in zip(outs, sig.outputs))
            except ValueError:  # a layout no rank can hold (a strided split nested in another split)
                continue
            local = [TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ib, metas)]
            try:
                here = reg.localize(dict(attrs), LocalContext(tuple(metas), tuple(outs), ib, ob, sig))
            except (ValueError, RuntimeError, IndexError):
                continue
            yield local, here


def test_shape_formulas_equal_the_meta_kernels_on_every_shard(graph):
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    seen, answered = set(), Counter()
    for op in graph.ops:
        if op.type.count(".") != 2:
            continue
        metas = [graph.tensors[t].meta for t in op.inputs]
        reg = get_op(op.type)
        for ms, attrs in [(metas, op.attrs), *_shards(reg, metas, op.attrs, mesh)]:
            key = (op.type, tuple(ms), freeze(attrs))
            if key in seen:
                continue
            seen.add(key)
            shapes = output_shapes(op.type, ms, attrs)
            try:
                want = opdef._infer_kernel(op.type, tuple(ms), freeze_attrs(attrs))
            except (ValueError, RuntimeError, IndexError):
                assert shapes is None, (op.name, ms, shapes)  # torch refuses it: no formula answers
                continue
            if shapes is None:
                continue
            got = opdef._infer.__wrapped__(op.type, tuple(ms), freeze_attrs(attrs))
            assert got == want, (op.name, op.type, ms)
            answered[op.type] += 1
    assert sum(answered.values()) > 300 and len(answered) >= 10  # many calls of many ops


@pytest.mark.parametrize("name, shapes, args", [
    ("aten.add.Tensor", [(4, 3), (2, 3)], (Slot(0), Slot(1))),
    ("aten.where.self", [(4, 1), (1, 3), (2, 3)], (Slot(0), Slot(1), Slot(2))),
    ("aten.mm.default", [(4, 3), (2, 5)], (Slot(0), Slot(1))),
    ("aten.view.default", [(4, 3)], (Slot(0), (5, -1))),
    ("aten.view.default", [(4, 3)], (Slot(0), (2, 2, 2))),
    ("aten.expand.default", [(4, 3)], (Slot(0), (4, 2))),
    ("aten.expand.default", [(4, 3)], (Slot(0), (-1, 4, 3))),
    ("aten.transpose.int", [(4, 3)], (Slot(0), 0, 2)),
    ("aten.unsqueeze.default", [(4, 3)], (Slot(0), 4)),
    ("aten.addmm.default", [(3,), (4, 3), (3, 5)], (Slot(0), Slot(1), Slot(2))),
    ("aten.sum.dim_IntList", [(4, 3)], (Slot(0), (0, -2))),
    ("aten.sum.dim_IntList", [(4, 3)], (Slot(0), (2,))),
])
def test_shape_formulas_answer_nothing_torch_refuses(name, shapes, args):
    metas = tuple(TensorMeta(s) for s in shapes)
    assert output_shapes(name, metas, {"args": args}) is None
    with pytest.raises((RuntimeError, IndexError, ValueError)):
        opdef._infer(name, metas, freeze_attrs({"args": args}))


@pytest.mark.parametrize("shape, mesh", [((4, 8), [[0, 1], [2, 3]]), ((6, 5, 3), [[0, 1, 2, 3], [4, 5, 6, 7]]),
                                         ((8,), [0, 1, 2, 3])])
def test_boxing_prices_without_the_plan_equal_the_plans(shape, mesh):
    """Deduction prices a boxing from the planner's route without making the plan: the same time (to the
    last bit), bytes and steps as the plan, and the same error where there is none, for every pair of layouts."""
    pl = sl.Placement("cpu", mesh)
    per_axis = [B, P, *(S(d) for d in range(len(shape)))]
    layouts = list(itertools.product(per_axis, repeat=pl.ndim))
    priced = 0
    for src, dst in itertools.product(layouts, layouts):
        try:
            want = BoxingCost.of(plan_boxing(shape, src, dst, pl))
        except SbplabError as e:
            with pytest.raises(type(e)):
                route_cost(TensorMeta(shape), src, dst, pl)
            continue
        assert route_cost(TensorMeta(shape), src, dst, pl) == want, (src, dst)
        priced += want.bytes > 0
    assert priced >= len(layouts)  # many pairs communicate


@pytest.mark.parametrize("name", sorted(BROADCAST))
def test_every_broadcasting_formula_equals_its_kernel(name):
    """Each op the broadcasting formula answers, the models' or not: called with its schema's tensors
    (Scalars 2, the rest defaulted) on shapes that broadcast, that are equal, and that do not."""
    args, n = [], 0
    for a in overload(name)._schema.arguments:
        if a.kwarg_only or a.has_default_value():
            break
        if str(a.type).startswith("Tensor"):
            args.append(Slot(n))
            n += 1
        else:
            assert str(a.type) in ("Scalar", "number"), a
            args.append(2)
    dt = torch.int64 if name.split(".")[1].startswith(("bitwise", "logical")) else torch.float32
    dtypes = [torch.bool, dt, dt] if name == "aten.where.self" else [dt] * n
    attrs = {"args": tuple(args)}
    refused = 0
    for shapes in ([(4, 1, 3), (2, 3), (1,)], [(4, 3), (4, 3), (4, 3)], [(4, 3), (2, 3), (3,)]):
        metas = tuple(TensorMeta(s, d) for s, d in zip(shapes, dtypes))
        try:
            want = opdef._infer_kernel(name, metas, freeze_attrs(attrs))
        except RuntimeError:
            assert output_shapes(name, metas, attrs) is None
            refused += 1
            continue
        assert output_shapes(name, metas, attrs) is not None
        assert opdef._infer.__wrapped__(name, metas, freeze_attrs(attrs)) == want
    assert refused == (n > 1)  # only the shapes that do not broadcast, and only with two tensors or more
