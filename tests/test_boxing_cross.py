"""Boxing across placements: other ranks, other counts, other mesh shapes, other device types."""

from __future__ import annotations

import itertools

import pytest
import torch
from block_counts import block_numel, block_overlap
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.boxing.move import has_partial, plan_move
from sbplab.boxing.planner import find_cross
from sbplab.boxing.route import add, partial_ops, routes_from, routes_to
from sbplab.layout import LayoutError, assemble, check_layout, local_block, random_shards
from sbplab.sbp import B, P, S

ITEM = 4


def _full(shape, seed=0):
    return torch.randint(-20, 21, shape, generator=torch.Generator().manual_seed(seed)).float()


def _check_moves(plan):
    """Reported bytes equal the data that crossed: the transfers between different ranks."""
    for step in plan.steps:
        if step.mesh_axis is not None:
            continue
        crossed_out = dict.fromkeys(step.src_placement.rank_list, 0)
        crossed_in = dict.fromkeys(step.placement.rank_list, 0)
        for t in step.transfers:
            if t.src_rank != t.dst_rank:
                crossed_out[t.src_rank] += t.numel * ITEM
                crossed_in[t.dst_rank] += t.numel * ITEM
            # no partial value ever travels to a differently shaped mesh
            assert not has_partial(step.src_sbp) or step.src_placement.shape == step.placement.shape
        assert step.bytes_sent == crossed_out
        assert step.bytes_recv == crossed_in


def _run(plan, shape, seed=0):
    full = _full(shape, seed)
    out = plan.run(random_shards(full, plan.src_placement, plan.src_sbp, torch.Generator().manual_seed(seed)))
    assert set(out) == set(plan.dst_placement.rank_list)
    assert torch.equal(assemble(out, plan.dst_placement, plan.dst_sbp).cpu(), full)


@pytest.mark.parametrize("src,dst", list(itertools.product(["S(0)", "S(1)", "B", "P", "P(max)"], repeat=2)))
def test_stage_to_stage(src, dst):
    """Two ranks to two other ranks (pipeline stage 0 -> stage 1), every pair of SBPs."""
    shape = (6, 5)
    plan = plan_boxing(shape, src, dst, sl.Placement("cpu", [0, 1]), sl.Placement("cpu", [2, 3]))
    _run(plan, shape)
    _check_moves(plan)
    (move,) = [s for s in plan.steps if s.mesh_axis is None]
    assert move.kind == "send_recv"
    # disjoint ranks: every element a destination rank ends the move with came over the wire
    for r in (2, 3):
        assert move.bytes_recv[r] == block_numel(local_block(shape, move.placement, move.dst_sbp, r)) * ITEM
    if src == dst:  # the cheapest is to ship each shard as it is, partial ones too
        assert plan.kinds == ("send_recv",)
        assert move.groups == ((0, 2), (1, 3))


def test_four_ranks_to_two():
    shape = (8, 4)
    src_pl, dst_pl = sl.Placement("cpu", [0, 1, 2, 3]), sl.Placement("cpu", [0, 1])
    plan = plan_boxing(shape, "S(0)", "S(0)", src_pl, dst_pl)
    _run(plan, shape)
    _check_moves(plan)
    assert plan.kinds == ("send_recv",)
    # independent count: rows a destination rank needs that it did not hold itself
    want = 0
    for r in dst_pl.rank_list:
        need = local_block(shape, dst_pl, (S(0),), r)
        want += block_numel(need) - block_overlap(need, local_block(shape, src_pl, (S(0),), r))
    assert plan.total_bytes == want * ITEM == 96


def test_partial_reduces_before_changing_rank_count():
    shape = (8, 8)
    plan = plan_boxing(shape, "P", "B", sl.Placement("cpu", [0, 1, 2, 3]), sl.Placement("cpu", [4, 5]))
    _run(plan, shape, seed=3)
    _check_moves(plan)
    move_at = plan.kinds.index("send_recv")
    assert plan.steps[0].kind in ("reduce_scatter", "all_reduce")
    assert not has_partial(plan.steps[move_at].src_sbp)


def test_2d_to_1d_on_new_ranks():
    shape = (8, 8)
    src_pl, dst_pl = sl.Placement("cpu", [[0, 1], [2, 3]]), sl.Placement("cpu", [4, 5, 6, 7])
    for src, dst in [("S(0), S(1)", "S(0)"), ("B, S(1)", "S(1)"), ("P, S(0)", "B"), ("S(1), S(0)", "P")]:
        plan = plan_boxing(shape, src, dst, src_pl, dst_pl)
        _run(plan, shape, seed=len(src))
        _check_moves(plan)
    plan = plan_boxing(shape, "S(0), S(1)", "S(0)", src_pl, dst_pl)
    assert plan.kinds == ("send_recv",) and plan.total_bytes == 8 * 8 * ITEM  # all of it, once


def test_local_copies_are_free():
    shape = (8, 8)
    plan = plan_boxing(shape, "B", "B", sl.Placement("cpu", [0, 1, 2, 3]), sl.Placement("cpu", [2, 3]))
    assert plan.kinds == ("copy",) and plan.total_bytes == 0 and plan.time_s == 0
    _run(plan, shape)
    plan = plan_boxing(shape, "S(0)", "S(0), S(0)", sl.Placement("cpu", [0, 1, 2, 3]),
                       sl.Placement("cpu", [[0, 1], [2, 3]]))
    assert plan.total_bytes == 0  # the nested quarters are the same rows on the same ranks
    _run(plan, shape)


def test_cpu_to_cuda_is_a_device_copy():
    shape = (4, 4)
    plan = plan_boxing(shape, "S(0)", "S(0)", sl.Placement("cpu", [0, 1]), sl.Placement("cuda", [0, 1]))
    (move,) = plan.steps
    assert move.kind == "send_recv" and "device copy" in move.why
    assert move.bytes_sent == {0: 32, 1: 32}  # the bytes cross the host-device bus
    if torch.cuda.is_available():
        _run(plan, shape)
    else:
        with pytest.raises(RuntimeError, match="no CUDA"):
            plan.run(sl.shard(_full(shape), plan.src_placement, plan.src_sbp))


@pytest.mark.parametrize("src,dst", [("S(0), B", "B"), ("P, S(1)", "S(0)"), ("S(1), S(0)", "P")])
def test_cross_choice_equals_brute_force(src, dst):
    """The branch and bound over (X, Y) finds the minimum of all box-move-box plans."""
    shape = (6, 4)
    src_pl, dst_pl = sl.Placement("cpu", [[0, 1], [2, 3]]), sl.Placement("cpu", [3, 4])
    cl = sl.Hardware.cpu_box()
    a, b = sl.parse_sbp(src), sl.parse_sbp(dst)
    ops = partial_ops(a, b)
    fr = routes_from(shape, a, src_pl.shape, ITEM, cl, ops)
    to = routes_to(shape, b, dst_pl.shape, ITEM, cl, ops)
    best = None
    for x, y in itertools.product(fr, to):
        m = plan_move(shape, x, y, src_pl, dst_pl, ITEM, cl)
        if m is not None:
            k = add(add(fr[x].key, m.key), to[y].key)
            best = k if best is None or k < best else best
    assert find_cross(shape, a, b, src_pl, dst_pl, ITEM, cl)[2] == best
    plan = plan_boxing(shape, src, dst, src_pl, dst_pl)
    assert plan.total_bytes == best[1] and len(plan.steps) == best[2]


MESHES = [[0, 1], [2, 3], [0, 1, 2, 3], [4, 5, 6], [[0, 1], [2, 3]], [[4, 5], [6, 7]], [[2, 3, 4]], [8],
          [[1, 2], [3, 4], [5, 6]]]


@st.composite
def cross_cases(draw):
    src_pl = sl.Placement("cpu", draw(st.sampled_from(MESHES)))
    dst_pl = sl.Placement("cpu", draw(st.sampled_from(MESHES)))
    shape = tuple(draw(st.lists(st.integers(2, 7), min_size=1, max_size=2)))
    entry = st.sampled_from([B, P, P("max")] + [S(d) for d in range(len(shape))] * 2)
    src = tuple(draw(entry) for _ in range(src_pl.ndim))
    dst = tuple(draw(entry) for _ in range(dst_pl.ndim))
    return shape, src, dst, src_pl, dst_pl, draw(st.integers(0, 999))


@settings(max_examples=60, deadline=None)
@given(cross_cases())
def test_cross_placement_keeps_the_value(case):
    shape, src, dst, src_pl, dst_pl, seed = case
    for pl, sbp in ((src_pl, src), (dst_pl, dst)):
        try:
            check_layout(shape, pl, sbp)
        except LayoutError:
            assume(False)
    plan = plan_boxing(shape, src, dst, src_pl, dst_pl)
    _run(plan, shape, seed)
    _check_moves(plan)
