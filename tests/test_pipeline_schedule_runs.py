"""Pipeline schedules in the compiler, the simulator and the runtime: the strategy's schedule orders
each rank's compute (simulated and measured runs follow it, action by action), sizes its registers,
keeps the predicted peak independent of link speed, and each schedule trains like torch."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import sbplab as sl
from sbplab.compiler.pipeline import pipeline_actions
from sbplab.models import MLP, MLPConfig
from sbplab.runtime.actor_plan import ActorPlan, RankPlan
from sbplab.runtime.schedule_trace import actions_run
from sbplab.runtime.specs import Recv

SCHEDULES = ("gpipe", "1f1b")


def _mlp():
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=32, width=64, hidden=128, n_blocks=2, n_classes=8))
    (x,), y = m.example_batch(32)
    return m, x, y


def _compile(m, x, y, schedule: str, micro: int = 4):
    if schedule == "interleaved_1f1b":  # two ranks, two stages each: 0 and 2 on rank 0, 1 and 3 on rank 1
        st = sl.Strategy(sl.mesh(pp=2), [sl.Pipeline("pp", micro_batches=micro, schedule=schedule)])
    else:
        st = sl.presets.pipeline(2, micro, schedule=schedule)
    return sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=st)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_strategy_schedule_is_each_rank_order_and_sizes_its_registers(schedule):
    m, x, y = _mlp()
    c = _compile(m, x, y, schedule)
    assert c.strategy.schedule == schedule
    plan = c.plan()
    expect = pipeline_actions(schedule, 2, 4)
    for r in (0, 1):
        rs = plan.ranks[r].schedule
        assert rs is not None and rs.name == schedule and rs.actions == expect[r]
    # stage 0 holds every micro-batch's activations under GPipe, two (S - s) under 1F1B
    regs = {a.registers for a in plan.ranks[0].actors if a.scope == "micro" and a.phase == "forward"}
    assert max(regs) == (4 if schedule == "gpipe" else 2)


def _without_schedules(plan: ActorPlan) -> ActorPlan:
    return ActorPlan(plan.world_size, {r: RankPlan(r, rp.actors) for r, rp in plan.ranks.items()},
                     device_type=plan.device_type, micro_batches=plan.micro_batches, name=plan.name)


def _link(hw: sl.Hardware, slower: float) -> sl.Hardware:
    return dataclasses.replace(hw, p2p_bandwidth=hw.p2p_bandwidth / slower, p2p_latency=hw.p2p_latency * slower)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_predicted_peak_and_compute_order_do_not_depend_on_link_speed(schedule):
    """Links 100x faster and 1000x slower than the CPU box's: the step time changes 1000-fold, but
    every rank computes in its schedule's order, so what it holds at its peak is the same; the one
    difference allowed is a gradient message still waiting for the slow link to take it (a sender
    holds what it sends until the transfer is done, at most one message here).
    Without the schedule, the compute lane's order itself changes with the link."""
    m, x, y = _mlp()
    c = _compile(m, x, y, schedule)
    plan = c.plan()
    message = max(torch.Size(a.shape).numel() * a.dtype.itemsize for rp in plan.ranks.values()
                  for a in rp.actors if isinstance(a, Recv))
    hw = sl.Hardware.cpu_box()
    pf, ps = sl.simulate(c, _link(hw, 0.01)), sl.simulate(c, _link(hw, 1000))
    assert ps.step_time > 100 * pf.step_time
    for r in plan.ranks:
        assert abs(pf.peak_memory[r] - ps.peak_memory[r]) <= message, (r, pf.peak_memory, ps.peak_memory)
    for p in (pf, ps):
        for r, seq in actions_run(p.trace, plan).items():
            assert tuple(seq) == plan.ranks[r].schedule.actions, (r, [str(a) for a in seq])
    free, feeds = _without_schedules(plan), dict(zip(c.graph.inputs, (x, y)))
    orders = [actions_run(sl.simulate(free, _link(hw, f), feeds=feeds).trace, plan) for f in (0.01, 1, 1000)]
    assert any(o != orders[0] for o in orders[1:]) or orders[0] != {r: list(plan.ranks[r].schedule.actions)
                                                                    for r in plan.ranks}


def test_gpipe_holds_more_than_1f1b_at_its_first_stage():
    m, x, y = _mlp()
    hw = sl.Hardware.cpu_box()
    peak = {s: sl.simulate(_compile(m, x, y, s, micro=8), hw).peak_memory for s in SCHEDULES}
    assert peak["gpipe"][0] > peak["1f1b"][0]


def test_interleaved_1f1b_places_two_stages_on_each_rank():
    m, x, y = _mlp()
    c = _compile(m, x, y, "interleaved_1f1b")
    assert c.strategy.n_stages == 4
    plan = c.plan()
    expect = pipeline_actions("interleaved_1f1b", 2, 4, 2)
    for r in (0, 1):
        rs = plan.ranks[r].schedule
        assert rs.actions == expect[r] and set(rs.stage_of.values()) == {r, r + 2}
    p = sl.simulate(c, sl.Hardware.cpu_box())
    assert {r: tuple(seq) for r, seq in actions_run(p.trace, plan).items()} == expect


def test_pipeline_schedule_arguments_are_checked():
    with pytest.raises(sl.InputError, match="interleaved_1f1b"):
        sl.Pipeline("pp", micro_batches=4, schedule="1f1b", stages_per_rank=2)
    with pytest.raises(sl.InputError, match="multiple of 2"):
        sl.compile(*_mlp_args(), strategy=sl.Strategy(sl.mesh(pp=2), [
            sl.Pipeline("pp", micro_batches=5, schedule="interleaved_1f1b")]))


def test_hand_set_registers_leave_the_order_to_them():
    """``plan(registers=R)`` is the register experiment: no schedule, the registers alone bound how far
    a stage runs ahead."""
    m, x, y = _mlp()
    c = _compile(m, x, y, "gpipe")
    plan = c.plan(registers=1)
    assert all(rp.schedule is None for rp in plan.ranks.values())
    assert {a.registers for a in plan.ranks[0].actors if a.scope == "micro" and a.kind == "compute"} == {1}
    assert c.plan().ranks[0].schedule.name == "gpipe"


def _mlp_args():
    m, x, y = _mlp()
    return m, (x,), m.loss_fn, y


@pytest.mark.multiprocess
@pytest.mark.parametrize("schedule", (*SCHEDULES, "interleaved_1f1b"))
def test_each_schedule_trains_like_torch_and_runs_in_its_order(schedule):
    m, x, y = _mlp()
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        loss = m.loss_fn(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    c = _compile(m, x, y, schedule)
    with sl.LocalCluster(2) as cluster:
        res = cluster.run(c, (x, y), steps=2, progress=False)
    assert res.losses == pytest.approx(losses, rel=1e-4, abs=1e-5)
    for name, p in ref.named_parameters():
        assert torch.allclose(res.params[name].full(), p.detach(), atol=1e-4), name
    plan = c.plan()
    for step in (0, 1):
        for r, seq in actions_run(res.trace, plan, step).items():
            assert tuple(seq) == plan.ranks[r].schedule.actions, (step, r, [str(a) for a in seq])
