"""Deriving the communication order from one rank per class gives the full simulation's order, slot for slot.

Pipelines with data or tensor parallelism inside their stages have a few classes of ranks (one per stage)
that move in lockstep; ``derive_comm_order`` then simulates one rank per class (``schedule_classes``).
Here that order is compared with the simulation of every rank (``derive_all``): several schedules,
micro-batch counts, steps, idle ranks; and ranks made different must not share a class.
"""

from __future__ import annotations

import dataclasses

import pytest
from tiny_steps import tiny_gpt_step, tiny_mlp_step

from sbplab.compiler import SGD, Adam, presets
from sbplab.runtime.actor_plan import ActorPlan, RankPlan
from sbplab.runtime.calibrate_comm import collective_plan, comm_axes
from sbplab.runtime.schedule import derive_all, derive_comm_order
from sbplab.runtime.schedule_classes import _Comms, derive_by_class, rank_classes


def _gpt(strategy, optimizer, heads=2):
    return tiny_gpt_step(strategy, optimizer, heads)


def _mlp(strategy, optimizer):
    return tiny_mlp_step(strategy, optimizer, batch=16)


def _classes(plan):
    busy = [r for r, rp in plan.ranks.items() if rp.n_actors]
    cls = rank_classes(plan, busy, _Comms(plan, busy))
    return len(set(cls.values())), len(busy)


PIPES = [
    ("mlp 2 stages x dp2, 4 micro", lambda: _mlp(presets.pipeline(2, 4, 2, inner="dp"), Adam(lr=1e-3)), 2),
    ("gpt 2 stages x dp2, 2 micro", lambda: _gpt(presets.pipeline(2, 2, 2, inner="dp"), Adam(lr=1e-3)), 2),
    ("gpt 2 stages x tp2, 4 micro", lambda: _gpt(presets.pipeline(2, 4, 2, inner="tp"), SGD(lr=1e-2)), 2),
    ("mlp 4 stages x dp2 gpipe", lambda: _mlp(presets.pipeline(4, 4, 2, inner="dp", schedule="gpipe"), SGD(lr=1e-2)),
     4),
]


@pytest.mark.parametrize("name,make,stages", PIPES, ids=[p[0] for p in PIPES])
def test_one_rank_per_class_gives_the_order_of_all(name, make, stages):
    step = make()
    for kw in ({}, {"world_size": step.plan().world_size + 1}):
        plan = step.plan(**kw)
        n_cls, n_busy = _classes(plan)
        assert n_cls == stages < n_busy
        full = derive_all(plan)
        assert len(full) > 0
        assert derive_by_class(plan) == full == plan.comm_order
    plan = step.plan()
    assert derive_by_class(plan, steps=2) == derive_all(plan, steps=2)


def test_ranks_made_different_leave_their_class():
    plan = _mlp(presets.pipeline(2, 4, 2, inner="dp"), SGD(lr=1e-2)).plan()
    assert _classes(plan) == (2, 4)
    # one actor on rank 1 keeps another register count: it no longer moves with its stage's other rank
    actors = list(plan.ranks[1].actors)
    i = next(i for i, a in enumerate(actors) if a.lane != "comm" and a.scope == "micro")
    actors[i] = dataclasses.replace(actors[i], registers=actors[i].registers + 1)
    ranks = {r: plan.ranks[r] if r != 1 else RankPlan(1, actors, plan.ranks[1].schedule) for r in plan.ranks}
    changed = ActorPlan(plan.world_size, ranks, micro_batches=plan.micro_batches)
    assert _classes(changed)[0] > 2
    got = derive_by_class(changed)
    assert got is None or got == derive_all(changed)
    assert changed.comm_order == derive_all(changed)


@pytest.mark.parametrize("n", [4, 6])
def test_one_collective_name_on_several_groups_gets_the_order_of_all(n):
    """Calibration's plans run a collective called "c0" on every group of a mesh axis: the full simulation
    matches them by name, so the per-class one steps aside (it once issued one group's and not the other's)."""
    for setting in comm_axes(n):
        plan = collective_plan("all_reduce", setting, (1024, 4096), n, "cpu")
        if len(setting.groups) > 1:
            assert derive_by_class(plan) is None
        for steps in (1, 2):
            full = derive_all(plan, steps)
            assert {s.rank for s in full} == set(range(n))
            assert derive_comm_order(plan, steps) == full
