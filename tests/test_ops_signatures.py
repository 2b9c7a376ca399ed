"""Signature lists: the paper's examples are there, the invalid ones are not, shapes filter n-D."""

from __future__ import annotations

import torch

from sbplab.ops import NdSignature, Signature, TensorMeta, get_op, nd_signatures, one_d_signatures, run_local
from sbplab.ops.registry import local_context
from sbplab.placement import Placement
from sbplab.sbp import B, P, S

PMAX, PMIN = P("max"), P("min")
LINE2, LINE3 = Placement("cpu", [0, 1]), Placement("cpu", [0, 1, 2])
MESH22 = Placement("cpu", [[0, 1], [2, 3]])


def one_d(name, *shapes, attrs=None, dtypes=None) -> set[Signature]:
    dtypes = dtypes or [torch.float32] * len(shapes)
    metas = [TensorMeta(s, d) for s, d in zip(shapes, dtypes)]
    return set(one_d_signatures(get_op(name), metas, attrs or {}))


def nd(name, placement, *shapes, attrs=None, dtypes=None) -> set[NdSignature]:
    dtypes = dtypes or [torch.float32] * len(shapes)
    metas = [TensorMeta(s, d) for s, d in zip(shapes, dtypes)]
    return set(nd_signatures(name, metas, attrs or {}, placement))


def s1(ins, outs) -> Signature:
    return Signature(tuple(ins), tuple(outs))


def test_matmul_has_the_papers_signatures_and_nothing_else():
    got = one_d("matmul", (4, 3), (3, 5))
    paper = {s1([S(0), B], [S(0)]), s1([B, S(1)], [S(1)]), s1([S(1), S(0)], [P]), s1([P, B], [P]),
             s1([B, P], [P])}
    assert got == paper | {s1([B, B], [B])}


def test_no_max_partial_flows_into_a_product_or_a_non_monotone_op():
    for name, shapes in [("matmul", [(4, 3), (3, 5)]), ("linear", [(4, 3), (5, 3)]),
                         ("conv2d", [(2, 3, 5, 5), (4, 3, 3, 3)]), ("gelu", [(4, 3)]),
                         ("mul", [(4, 3), (4, 3)]), ("softmax", [(4, 3)])]:
        attrs = {"dim": 1} if name == "softmax" else {}
        for sig in one_d(name, *shapes, attrs=attrs):
            assert PMAX not in sig.inputs and PMIN not in sig.inputs, f"{name}: {sig}"


def test_partials_of_elementwise_ops_follow_linearity_and_monotonicity():
    relu, gelu, neg, exp = (one_d(n, (4, 3)) for n in ("relu", "gelu", "neg", "exp"))
    assert s1([PMAX], [PMAX]) in relu and s1([PMIN], [PMIN]) in relu and s1([P], [P]) not in relu
    assert s1([PMAX], [PMAX]) in exp and s1([P], [P]) not in exp
    assert not any(isinstance(x, type(P)) for sig in gelu for x in sig.inputs)
    assert {s1([P], [P]), s1([PMAX], [PMIN]), s1([PMIN], [PMAX])} <= neg
    add, sub, mul, div = (one_d(n, (4, 3), (4, 3)) for n in ("add", "sub", "mul", "div"))
    assert s1([P, P], [P]) in add and s1([P, B], [P]) not in add
    assert s1([P, P], [P]) in sub and s1([B, PMAX], [PMIN]) in sub
    assert {s1([P, B], [P]), s1([B, P], [P])} <= mul and s1([P, P], [P]) not in mul
    assert s1([P, B], [P]) in div and s1([B, P], [P]) not in div


def test_broadcast_inputs_stay_b_where_the_output_is_split():
    got = one_d("add", (4, 1), (1, 5))
    assert s1([S(0), B], [S(0)]) in got and s1([B, S(1)], [S(1)]) in got
    got = one_d("mul", (3, 4, 5), (5,))
    assert {s1([S(0), B], [S(0)]), s1([S(1), B], [S(1)]), s1([S(2), S(0)], [S(2)])} <= got


def test_reductions_turn_a_split_of_a_reduced_dim_into_a_partial():
    assert one_d("sum", (3, 4, 5), attrs={"dims": (0, 2)}) == {
        s1([B], [B]), s1([S(0)], [P]), s1([S(1)], [S(0)]), s1([S(2)], [P]), s1([P], [P])}
    assert s1([S(1)], [S(1)]) in one_d("mean", (3, 4, 5), attrs={"dims": (0,), "keepdim": True})
    assert one_d("max", (3, 4), attrs={"dim": -1}) == {
        s1([B], [B]), s1([S(0)], [S(0)]), s1([S(1)], [PMAX]), s1([PMAX], [PMAX])}


def test_model_parallel_signatures_of_linear_embedding_and_conv():
    lin = one_d("linear", (8, 4), (6, 4), (6,))
    assert s1([B, S(0), S(0)], [S(1)]) in lin  # column parallel
    assert s1([S(1), S(1), P], [P]) in lin  # row parallel, bias once
    assert s1([S(0), B, B], [S(0)]) in lin  # data parallel
    emb = one_d("embedding", (2, 5), (10, 4), dtypes=[torch.int64, torch.float32])
    assert {s1([B, S(0)], [P]), s1([B, S(1)], [S(2)]), s1([S(1), B], [S(1)])} <= emb
    conv = one_d("conv2d", (2, 3, 5, 5), (4, 3, 3, 3), (4,))
    assert {s1([S(0), B, B], [S(0)]), s1([B, S(0), S(0)], [S(1)]), s1([S(1), S(1), P], [P])} <= conv
    grouped = one_d("conv2d", (2, 4, 5, 5), (4, 2, 3, 3), attrs={"groups": 2})
    assert s1([B, S(0)], [S(1)]) not in grouped and s1([S(0), B], [S(0)]) in grouped


def test_nd_signatures_are_products_filtered_by_local_shapes():
    got = nd("matmul", MESH22, (4, 4), (4, 4))
    assert NdSignature(((S(0), B), (B, S(1))), ((S(0), S(1)),)) in got  # rows x columns
    assert NdSignature(((S(1), S(1)), (S(0), S(0))), ((P, P),)) in got  # k split twice
    # k = 3 over 2 x 2 leaves a rank without columns: that product is gone
    small = nd("matmul", MESH22, (4, 3), (3, 4))
    assert NdSignature(((S(1), S(1)), (S(0), S(0))), ((P, P),)) not in small
    assert list(nd_signatures("matmul", [TensorMeta((4, 3)), TensorMeta((3, 4))], {}, MESH22))[0] == \
        NdSignature(((B, B), (B, B)), ((B, B),))


def test_reshape_keeps_only_splits_whose_pieces_line_up():
    attrs = {"shape": (3, 2, 5)}
    s00 = NdSignature(((S(0),),), ((S(0),),))
    assert s00 not in nd("reshape", LINE2, (6, 5), attrs=attrs)  # 3 rows = 15 elements vs 2 of 3 outer rows
    assert s00 in nd("reshape", LINE3, (6, 5), attrs=attrs)  # 2 rows = 10 elements = 1 of 3 outer rows
    assert NdSignature(((S(1),),), ((S(2),),)) in nd("reshape", LINE2, (6, 5), attrs=attrs)


def test_gather_splits_rows_only_where_x_and_index_agree():
    same = one_d("gather", (3, 5), (3, 4), attrs={"dim": 1}, dtypes=[torch.float32, torch.int64])
    fewer = one_d("gather", (5, 4), (3, 4), attrs={"dim": 1}, dtypes=[torch.float32, torch.int64])
    assert s1([S(0), S(0)], [S(0)]) in same and s1([S(0), S(0)], [S(0)]) not in fewer
    assert s1([B, S(1)], [S(1)]) in fewer and s1([PMAX, B], [PMAX]) in fewer


def test_localize_gives_vocab_rows_and_global_counts():
    emb = get_op("embedding")
    metas = [TensorMeta((2, 5), torch.int64), TensorMeta((10, 4))]
    sig = NdSignature(((B,), (S(0),)), ((P,),))
    rows = [emb.localize({}, local_context(emb, metas, {}, sig, LINE3, r))["vocab_range"] for r in range(3)]
    assert rows == [(0, 4), (4, 7), (7, 10)]
    ids = torch.tensor([[0, 4, 9, 6, 3], [7, 7, 1, 5, 8]])
    w = torch.randn(10, 4)
    out = run_local(emb, [ids, w[4:7]], {}, metas, sig, LINE3, 1)[0]
    mine = (ids >= 4) & (ids < 7)
    assert torch.equal(out[mine], w[ids[mine]]) and torch.all(out[~mine] == 0)
    mean = get_op("mean")
    x = torch.randn(6, 4)
    sig = NdSignature(((S(0),),), ((P,),))
    local = run_local(mean, [x[:2]], {"dims": None}, [TensorMeta((6, 4))], sig, LINE3, 0)[0]
    assert torch.allclose(local, x[:2].sum() / 24)


def test_flops_count_multiply_adds_twice():
    mm = get_op("matmul")
    ins = [TensorMeta((2, 4, 3)), TensorMeta((3, 5))]
    assert mm.flops(ins, mm.infer(ins, {}), {}) == 2 * 2 * 4 * 3 * 5
    conv = get_op("conv2d")
    ins = [TensorMeta((2, 3, 5, 5)), TensorMeta((4, 3, 3, 3))]
    assert conv.flops(ins, conv.infer(ins, {"padding": 1}), {"padding": 1}) == 2 * 2 * 4 * 5 * 5 * 3 * 9
    lin = get_op("linear")
    ins = [TensorMeta((7, 3)), TensorMeta((5, 3)), TensorMeta((5,))]
    assert lin.flops(ins, lin.infer(ins, {}), {}) == 2 * 7 * 5 * 3 + 7 * 5


def test_rank_blocks_are_local_blocks_rank_by_rank_on_uneven_and_empty_splits():
    """Signature validity reads every rank's blocks off ``_rank_blocks`` (built one mesh axis at a time);
    they must be ``local_block``'s, with None where a shard is empty, and the first rank of each block."""
    import itertools

    from sbplab.layout import local_block
    from sbplab.ops.registry import _rank_blocks

    for ranks in ([0, 1, 2, 3], [[0, 1, 2], [3, 4, 5]], [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]):
        pl = Placement("cpu", ranks)
        for shape in [(5, 7), (3,), (2, 9, 4), (0, 4), (1, 6)]:
            entries = [S(d) for d in range(len(shape))] + [B, P]
            for sbp in itertools.product(entries, repeat=pl.ndim):
                blocks, first = _rank_blocks(shape, sbp, pl.shape)
                want = [local_block(shape, pl, sbp, r) for r in pl.rank_list]
                want = [None if 0 not in shape and any(e - s <= 0 for s, e in b) else b for b in want]
                assert list(blocks) == want, (pl.shape, shape, sbp)
                assert list(first) == [want.index(b) for b in want]
