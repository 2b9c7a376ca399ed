"""One mesh axis: every transition of BRIEF's table, its bytes per rank, and exact uneven bytes."""

from __future__ import annotations

import itertools

import pytest
import torch
from block_counts import block_numel, block_overlap
from hypothesis import given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.layout import assemble, balanced_sizes, local_block, local_shape, random_shards
from sbplab.sbp import B, P, Partial, S, Split

ENTRIES = [S(0), S(1), B, P, P("max"), P("min")]
SHAPE = (12, 24)  # every dim divisible by 2, 3 and 4: the even case of the table
ITEM = 4  # float32


def expected(a, b, T: int, p: int) -> tuple[tuple[str, ...], float]:
    """(steps, bytes sent per rank) straight from BRIEF's table (T bytes, p ranks)."""
    if a == b:
        return (), 0
    if a == B:
        return ("slice",) if isinstance(b, Split) else ("zero",), 0
    if isinstance(a, Split):
        if isinstance(b, Partial):
            return ("zero",), 0
        if b == B:
            return ("all_gather",), T * (p - 1) / p
        return ("all_to_all",), T * (p - 1) / p**2
    if b == B:
        return ("all_reduce",), 2 * T * (p - 1) / p
    if isinstance(b, Split):
        return ("reduce_scatter",), T * (p - 1) / p
    # P(x) -> P(y) has no row: a reduce-scatter then filling the identity of y is the cheapest route
    return ("reduce_scatter", "zero"), T * (p - 1) / p


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("a,b", list(itertools.product(ENTRIES, ENTRIES)), ids=repr)
def test_one_axis_table(a, b, p):
    pl = sl.Placement("cpu", list(range(p)))
    plan = plan_boxing(SHAPE, a, b, pl)
    T = SHAPE[0] * SHAPE[1] * ITEM
    kinds, per_rank = expected(a, b, T, p)
    assert plan.kinds == kinds
    for step in plan.steps:
        assert step.mesh_axis == 0
    sent = plan.bytes_sent_per_rank()
    assert set(sent.values()) <= {per_rank}
    assert plan.max_bytes_per_rank == per_rank
    assert plan.total_bytes == per_rank * p
    for step in plan.steps:  # ring collectives are symmetric in the even case
        assert sorted(step.bytes_recv.values()) == sorted(step.bytes_sent.values())
    full = torch.randint(-9, 10, SHAPE).float()
    out = plan.run(random_shards(full, pl, (a,), torch.Generator().manual_seed(p)))
    assert torch.equal(assemble(out, pl, (b,)), full)


@pytest.mark.parametrize("p", [2, 4])
def test_time_is_latency_times_steps_plus_bytes_over_bandwidth(p):
    cl = sl.Hardware.h100_node()
    pl = sl.Placement("cuda", list(range(p)))
    T = SHAPE[0] * SHAPE[1] * ITEM
    bw, lat = cl.link(0)
    ag = plan_boxing(SHAPE, "S(0)", "B", pl, hardware=cl)
    ar = plan_boxing(SHAPE, "P", "B", pl, hardware=cl)
    assert ag.time_s == pytest.approx(lat * (p - 1) + T * (p - 1) / p / bw)
    assert ar.time_s == pytest.approx(lat * 2 * (p - 1) + 2 * T * (p - 1) / p / bw)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 5), n0=st.integers(5, 13), n1=st.integers(5, 11),
       pair=st.sampled_from([("S(0)", "B"), ("P", "S(1)"), ("P", "B"), ("S(0)", "S(1)"), ("S(1)", "S(0)")]))
def test_uneven_bytes_are_exact(p, n0, n1, pair):
    """Per-rank bytes for uneven splits, counted from the actual blocks the ranks hold.

    All-gather and reduce-scatter pad every piece to the largest (Gloo and NCCL take equal pieces), so
    each rank forwards p - 1 largest pieces: what the runtime really sends, and what the plan says.
    """
    pl = sl.Placement("cpu", list(range(p)))
    shape = (n0, n1)
    a, b = (sl.parse_sbp(x) for x in pair)
    plan = plan_boxing(shape, a, b, pl)
    (step,) = plan.steps
    T = n0 * n1
    ranks = pl.rank_list
    for i, r in enumerate(ranks):
        if step.kind == "all_gather":  # ring of padded pieces: p - 1 of the largest go out and come in
            want_s = want_r = (p - 1) * max(block_numel(local_block(shape, pl, a, o)) for o in ranks)
        elif step.kind == "reduce_scatter":
            want_s = want_r = (p - 1) * max(block_numel(local_block(shape, pl, b, o)) for o in ranks)
        elif step.kind == "all_reduce":  # reduce-scatter + all-gather over the flat tensor
            c = balanced_sizes(T, p)
            want_s = 2 * T - c[i] - c[(i + 1) % p]
            want_r = 2 * T - c[(i - 1) % p] - c[i]
        else:  # all-to-all: exactly the blocks that change owner
            mine_a, mine_b = local_block(shape, pl, a, r), local_block(shape, pl, b, r)
            want_s = sum(block_overlap(mine_a, local_block(shape, pl, b, o)) for o in ranks if o != r)
            want_r = sum(block_overlap(mine_b, local_block(shape, pl, a, o)) for o in ranks if o != r)
        assert step.bytes_sent[r] == want_s * ITEM
        assert step.bytes_recv[r] == want_r * ITEM
    assert sum(step.bytes_sent.values()) == sum(step.bytes_recv.values())


def test_T_is_the_piece_left_by_the_other_axes():
    """On a 2x3 mesh, an all-gather over axis 1 only moves the piece that axis 0 left each group."""
    pl = sl.Placement("cpu", [[0, 1, 2], [3, 4, 5]])
    shape = (8, 9)
    plan = plan_boxing(shape, "S(0), S(1)", "S(0), B", pl)
    (step,) = plan.steps
    assert step.kind == "all_gather" and step.mesh_axis == 1
    assert step.groups == ((0, 1, 2), (3, 4, 5))
    for r in pl.rank_list:
        piece = local_shape(shape, pl, sl.parse_sbp("S(0), B"), r)  # (4, 9)
        assert step.bytes_sent[r] == piece[0] * piece[1] * ITEM * 2 // 3
