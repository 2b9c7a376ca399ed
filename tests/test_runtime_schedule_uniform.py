"""Deriving the communication order from one rank gives the full simulation's order, slot for slot.

Where every rank runs the same actors (data, tensor, ZeRO parallelism), ``derive_comm_order``
simulates one rank and rebuilds the order (``schedule_uniform``). Here that order is compared with
the simulation of every rank (``derive_all``) on compiled plans with micro-batches, buckets, several
steps and idle ranks, and plans whose ranks differ (pipelines, one changed register count) must
take the full simulation.
"""

from __future__ import annotations

import dataclasses

import pytest
from tiny_steps import tiny_gpt_step, tiny_mlp_step

from sbplab.compiler import SGD, Adam, presets
from sbplab.runtime.actor_plan import ActorPlan, RankPlan
from sbplab.runtime.schedule import derive_all, derive_comm_order
from sbplab.runtime.schedule_uniform import derive_from_one, uniform_rank


def _gpt(strategy, optimizer, heads=2):
    return tiny_gpt_step(strategy, optimizer, heads)


def _mlp(strategy, optimizer):
    return tiny_mlp_step(strategy, optimizer, batch=12)


UNIFORM = [
    ("gpt dp x tp, 2 micro", lambda: _gpt(presets.dp_tp((2, 2), micro_batches=2), Adam(lr=1e-3))),
    # several groups at one position, named c8 .. c11: the order (8 before 10) decides, not the text
    ("gpt dp x tp 2x4", lambda: _gpt(presets.dp_tp((2, 4)), Adam(lr=1e-3), heads=4)),
    ("gpt tp", lambda: _gpt(presets.tensor_parallel(4), Adam(lr=1e-3))),
    ("gpt zero-3, 2 micro", lambda: _gpt(presets.zero(4, micro_batches=2), Adam(lr=1e-3))),
    ("mlp dp x3", lambda: _mlp(presets.data_parallel(3), Adam(lr=1e-3))),
    ("mlp zero-2", lambda: _mlp(presets.zero(2, shard_params=False), SGD(lr=1e-2, momentum=0.9))),
]


@pytest.mark.parametrize("name,make", UNIFORM, ids=[u[0] for u in UNIFORM])
def test_one_rank_gives_the_order_of_all(name, make):
    step = make()
    used = step.plan().world_size
    for kw in ({}, {"world_size": used + 2}, {"registers": 1}):
        plan = step.plan(**kw)
        assert uniform_rank(plan) == 0
        full = derive_all(plan)
        assert len(full) > 0
        assert derive_from_one(plan, 0) == full == plan.comm_order
        assert derive_comm_order(plan, steps=2) == derive_all(plan, steps=2)


def test_bucketed_and_unbucketed_gradients():
    for mb in (0.0, 0.001):
        strategy = presets.dp_tp((2, 2), micro_batches=2)
        strategy.bucket_mb = mb
        plan = _gpt(strategy, Adam(lr=1e-3)).plan()
        assert uniform_rank(plan) == 0
        assert derive_from_one(plan, 0) == derive_all(plan)


def test_ranks_that_differ_take_the_full_simulation():
    pipe = _mlp(presets.pipeline(2, 2), SGD(lr=1e-2)).plan()
    assert uniform_rank(pipe) is None  # different stages, and sends and receives
    plan = _mlp(presets.data_parallel(2), SGD(lr=1e-2)).plan()
    assert uniform_rank(plan) == 0
    # one actor on rank 1 keeps another register count: ranks no longer move in lockstep for sure
    actors = list(plan.ranks[1].actors)
    actors[0] = dataclasses.replace(actors[0], registers=actors[0].registers + 1)
    changed = ActorPlan(plan.world_size, {0: plan.ranks[0], 1: RankPlan(1, actors)},
                        micro_batches=plan.micro_batches)
    assert uniform_rank(changed) is None
    assert changed.comm_order == derive_all(changed)


def test_collectives_ready_together_go_by_their_order_not_their_position():
    """Two ranks, two collectives ready in the same tick: the one with the lower ``order`` is issued
    first although it sits later (names compare as text only between groups of one position)."""
    from sbplab.runtime.specs import Collective, Compute

    k = "sbplab.runtime.kernels:noop"

    def actors():
        return [Compute("x", op=k), Collective("c10", group=(0, 1), inputs=("x",), order=10),
                Collective("c9", group=(0, 1), inputs=("x",), order=9)]

    plan = ActorPlan.build(2, {0: actors(), 1: actors()})
    assert uniform_rank(plan) == 0
    assert [(s.rank, s.actor) for s in plan.comm_order] == [(0, "c9"), (1, "c9"), (0, "c10"), (1, "c10")]
    assert plan.comm_order == derive_all(plan)
