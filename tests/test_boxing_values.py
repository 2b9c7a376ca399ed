"""Boxing keeps the logical value: random layouts on 1-D, 2-D and 3-D meshes, every single valid
step exhaustively, and the two validity rules shown to be necessary."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.boxing import BoxingStep, plan_boxing
from sbplab.boxing.costs import edge_cost, state_ok, step_problem
from sbplab.boxing.execute import run_axis_step
from sbplab.boxing.planner import _axis_steps
from sbplab.layout import LayoutError, assemble, check_layout, random_shards
from sbplab.sbp import B, P, S

MESHES = [(2,), (3,), (4,), (8,), (2, 2), (2, 3), (3, 2), (2, 4), (4, 2), (1, 2), (2, 2, 2), (2, 1, 2)]


def _full(shape, seed: int) -> torch.Tensor:
    return torch.randint(-20, 21, shape, generator=torch.Generator().manual_seed(seed)).float()


@st.composite
def cases(draw):
    mesh_shape = draw(st.sampled_from(MESHES))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    entry = st.sampled_from([B, P, P, P("max"), P("min")] + [S(d) for d in range(len(shape))] * 2)
    src = tuple(draw(entry) for _ in mesh_shape)
    dst = tuple(draw(entry) for _ in mesh_shape)
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.int64]))
    return mesh_shape, shape, src, dst, draw(st.integers(0, 2**16)), dtype


def _fits(shape, pl, sbp) -> bool:
    try:
        check_layout(shape, pl, sbp)
    except LayoutError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(cases())
def test_plan_run_keeps_the_value(case):
    mesh_shape, shape, src, dst, seed, dtype = case
    n = 1
    for m in mesh_shape:
        n *= m
    pl = sl.Placement("cpu", torch.arange(n).reshape(mesh_shape).tolist())
    assume(_fits(shape, pl, src) and _fits(shape, pl, dst))
    full = _full(shape, seed).to(dtype)
    shards = random_shards(full, pl, src, torch.Generator().manual_seed(seed))
    assert torch.equal(assemble(shards, pl, src), full)  # the input really holds `full`
    plan = plan_boxing(shape, src, dst, pl, dtype=dtype)
    out = plan.run(shards)
    for r in pl.rank_list:
        assert tuple(out[r].shape) == sl.local_shape(shape, pl, dst, r)
    assert torch.equal(assemble(out, pl, dst), full)
    if src == dst:
        assert plan.steps == () and plan.total_bytes == 0


def _every_valid_step(shape, pl, entries):
    for state in itertools.product(entries, repeat=pl.ndim):
        if not state_ok(shape, pl.shape, state):
            continue
        for axis, new in itertools.product(range(pl.ndim), entries):
            nxt = state[:axis] + (new,) + state[axis + 1:]
            if not state_ok(shape, pl.shape, nxt):
                continue
            c = edge_cost(shape, pl.shape, state, axis, new, 4, sl.Hardware.cpu_box())
            if c is not None:
                yield state, axis, new, nxt


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_every_valid_single_step_keeps_the_value_2x2(dtype):
    pl = sl.Placement("cpu", [[0, 1], [2, 3]])
    shape = (5, 6)  # dim 0 uneven at both levels
    full = _full(shape, 1).to(dtype)  # int64: identities of max/min are finite and must not overflow
    n = 0
    for state, axis, new, nxt in _every_valid_step(shape, pl, [S(0), S(1), B, P, P("max"), P("min")]):
        (step,) = _axis_steps(shape, state, ((axis, new),), pl, 4, sl.Hardware.cpu_box())
        shards = random_shards(full, pl, state, torch.Generator().manual_seed(n))
        out = run_axis_step(step, shards, shape)
        assert torch.equal(assemble(out, pl, nxt), full), (state, axis, new)
        n += 1
    assert n >= 200  # guards against a vacuous loop: most steps stay valid


def test_every_valid_single_step_keeps_the_value_2x2x2():
    pl = sl.Placement("cpu", [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    shape = (5, 4, 3)
    full = _full(shape, 2)
    n = 0
    for state, axis, new, nxt in _every_valid_step(shape, pl, [S(0), S(1), B, P, P("max")]):
        (step,) = _axis_steps(shape, state, ((axis, new),), pl, 4, sl.Hardware.cpu_box())
        out = run_axis_step(step, random_shards(full, pl, state, torch.Generator().manual_seed(n)), shape)
        assert torch.equal(assemble(out, pl, nxt), full), (state, axis, new)
        n += 1
    assert n > 500


def _forced_step(kind, pl, state, axis, new, op=None) -> BoxingStep:
    """A step the planner refuses, built by hand to show what it would do."""
    nxt = state[:axis] + (new,) + state[axis + 1:]
    zeros = dict.fromkeys(pl.rank_list, 0)
    return BoxingStep(kind=kind, mesh_axis=axis, src_sbp=state, dst_sbp=nxt, placement=pl,
                      groups=tuple(pl.groups(axis)), bytes_sent=zeros, bytes_recv=zeros, time_s=0.0,
                      why="forced", reduce_op=op)


def test_nesting_rule_is_needed():
    """Gathering dim 0 on axis 0 while axis 1 also splits dim 0 puts rows in the wrong order."""
    pl = sl.Placement("cpu", [[0, 1], [2, 3]])
    shape, state = (8, 2), (S(0), S(0))
    assert step_problem(state, 0, B) is not None
    full = _full(shape, 3)
    step = _forced_step("all_gather", pl, state, 0, B)
    out = run_axis_step(step, sl.shard(full, pl, state), shape)
    assert not torch.equal(assemble(out, pl, (B, S(0))), full)
    plan = plan_boxing(shape, state, (B, S(0)), pl)  # the planner goes around
    assert torch.equal(assemble(plan.run(sl.shard(full, pl, state)), pl, (B, S(0))), full)


def test_inner_partial_must_be_reduced_first():
    """(P, P(max)) is a sum of maxima: summing over axis 0 first gives a different number."""
    pl = sl.Placement("cpu", [[0, 1], [2, 3]])
    shape, state = (4, 3), (P, P("max"))
    assert step_problem(state, 0, B) is not None
    assert step_problem(state, 1, B) is None
    full = _full(shape, 4)
    shards = random_shards(full, pl, state, torch.Generator().manual_seed(4))
    step = _forced_step("all_reduce", pl, state, 0, B, op="sum")
    assert not torch.equal(assemble(run_axis_step(step, shards, shape), pl, (B, P("max"))), full)
    plan = plan_boxing(shape, state, (B, B), pl)
    assert plan.steps[0].mesh_axis == 1 and plan.steps[0].reduce_op == "max"
    assert torch.equal(assemble(plan.run(shards), pl, (B, B)), full)
