"""Lowering one rank per group of alike ranks (``compiler/lowering/grouped.py``) makes the plan that lowering
every rank on its own makes: the same actors field by field, registers, schedules and communication order on
every rank, and the simulator predicts the same from it to the last bit.

The plans cover data x tensor parallelism with gradient accumulation and buckets, ZeRO-3, a pipeline of
data-parallel stages (whose ranks send and receive: the peers and tags differ), and a GPT whose dropouts draw
on every rank (their draws differ by rank).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import sbplab as sl
from sbplab.compiler import Adam, compile, presets
from sbplab.compiler.lowering.to_actors import lower_to_actors
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig
from sbplab.models.gpt import FeedForward
from sbplab.runtime.actor_plan import ActorPlan
from sbplab.runtime.schedule_uniform import uniform_rank
from sbplab.sim.predict import plan_of, simulate_plan


class _DropoutMLP(FeedForward):
    """The GPT's MLP with a dropout on its output (a random op: its draw names the rank)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.fc2(self.act(self.fc1(x))), 0.1, self.training)


def _gpt(strategy, dropout=False):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=4, n_embd=16))
    for block in m.blocks if dropout else ():
        block.mlp.__class__ = _DropoutMLP
    x = torch.randint(0, 32, (8, 8))
    return compile(m, (x,), loss_fn=GPT.loss_fn, target=x, optimizer=Adam(lr=1e-3), strategy=strategy)


def _mlp(strategy):
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=3, n_classes=4))
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    return compile(m, (x,), loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=Adam(lr=1e-3),
                   strategy=strategy)


def _same_value(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(v, b[k]) for k, v in a.items())
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_value, a, b))
    return a == b


def assert_same_plan(grouped: ActorPlan, alone: ActorPlan) -> None:
    assert grouped.world_size == alone.world_size and grouped.micro_batches == alone.micro_batches
    assert grouped.comm_order == alone.comm_order
    for r, rp in alone.ranks.items():
        gp = grouped.ranks[r]
        assert gp.schedule == rp.schedule, f"rank {r}: schedules differ"
        assert len(gp.actors) == len(rp.actors), f"rank {r}: {len(gp.actors)} vs {len(rp.actors)} actors"
        for a, b in zip(gp.actors, rp.actors):
            assert type(a) is type(b), f"rank {r}: {a.name} is a {type(a).__name__}, {b.name} a {type(b).__name__}"
            for f in dataclasses.fields(a):
                assert _same_value(getattr(a, f.name), getattr(b, f.name)), \
                    f"rank {r}, actor {b.name}: {f.name} {getattr(a, f.name)!r} vs {getattr(b, f.name)!r}"
        assert gp.comm_positions == [i for i, a in enumerate(rp.actors) if a.lane == "comm"]


CASES = [
    ("gpt dp x tp 2x4, 2 micro, dropout", lambda: _gpt(presets.dp_tp((2, 4), micro_batches=2), dropout=True), 4),
    ("gpt zero-3 x4", lambda: _gpt(presets.zero(4)), 1),
    ("mlp dp x4, small buckets", lambda: _mlp(dataclasses.replace(presets.data_parallel(4), bucket_mb=0.001)), 1),
    ("gpt pipeline 2 stages x dp_tp 2x2", lambda: _gpt(presets.pipeline(2, 2, (2, 2), inner="dp_tp")), None),
    ("mlp pipeline 2 stages x dp 2", lambda: _mlp(presets.pipeline(2, 2, ranks_per_stage=2, inner="dp")), 2),
]


@pytest.mark.parametrize("name,make,groups", CASES, ids=[c[0] for c in CASES])
def test_grouped_lowering_makes_the_same_plan(name, make, groups):
    step = make()
    grouped = lower_to_actors(step.physical, step.graph, outputs=True)
    alone = lower_to_actors(step.physical, step.graph, outputs=True, by_group=False)
    assert alone.alike is None
    assert_same_plan(grouped, alone)
    if groups is not None:  # every rank in a group: one representative per tensor-parallel position (the
        # vocabulary-parallel embedding's rows differ), one for all data-parallel ones
        assert len(grouped.alike) == groups
        assert sorted(m for ms in grouped.alike.values() for m in ms) == sorted(grouped.ranks)
        assert uniform_rank(grouped) == uniform_rank(alone) == (None if "pipeline" in name else 0)
    _, batch, comm = plan_of(step)
    hw = sl.Machine.a100_node()
    p1 = simulate_plan(grouped, hw, steps=2, batch=batch, comm=comm)
    p2 = simulate_plan(alone, hw, steps=2, batch=batch, comm=comm)
    assert p1.step_time == p2.step_time and p1.peak_memory == p2.peak_memory and p1.classes == p2.classes


def test_a_member_unlike_its_representative_is_lowered_alone():
    """A hand-made difference (one rank's kernel attribute) keeps that rank out of every group."""
    step = _mlp(presets.data_parallel(4))
    phys = step.physical
    n = next(n for n in phys.nodes if n.rank == 2 and n.kind == "compute" and n.attrs)
    key = next(iter(n.attrs))
    old = n.attrs[key]
    n.attrs = {**n.attrs, key: ("changed", old)}
    try:
        grouped = lower_to_actors(phys, step.graph)
        alone = lower_to_actors(phys, step.graph, by_group=False)
    finally:
        n.attrs = {**n.attrs, key: old}
    assert_same_plan(grouped, alone)
    assert all(2 not in ms for ms in grouped.alike.values())
    assert sorted(m for ms in grouped.alike.values() for m in ms) == [0, 1, 3]


def _grow(shapes):
    return tuple((*s[:-1], s[-1] + 1) if s else (2,) for s in shapes)


UNLIKE = [  # which node of rank 2 is changed, and how: each is a field the member check reads
    ("a state's shard", lambda n: n.kind == "source" and n.op == "param", lambda n: {"out_shapes": _grow(n.out_shapes)}),
    ("a reduction's shapes", lambda n: n.kind == "boxing" and n.collective is not None,
     lambda n: {"in_shapes": _grow(n.in_shapes), "out_shapes": _grow(n.out_shapes)}),
    ("a boxing's wiring", lambda n: n.kind == "boxing" and n.collective is not None, None),
]


def _rewire(phys, n):
    """Node n reading another output of its rank made before it (a source: it reads nothing itself)."""
    other = next(m for m in reversed(phys.nodes[:n.id]) if m.rank == n.rank and m.kind == "source"
                 and m.id != n.inputs[0].node)
    return {"inputs": (type(n.inputs[0])(other.id, 0),)}


@pytest.mark.parametrize("name,pick,change", UNLIKE, ids=[u[0] for u in UNLIKE])
def test_a_member_whose_state_or_boxing_differs_is_lowered_alone(name, pick, change):
    """A state or a boxing step that differs on one rank (its shard, its shapes, which output it reads) keeps
    that rank out of every group: the member check compares them however the nodes are matched."""
    step = _mlp(presets.zero(4))
    phys = step.physical
    n = next(n for n in phys.nodes if n.rank == 2 and pick(n))
    new = change(n) if change is not None else _rewire(phys, n)
    old = {k: getattr(n, k) for k in new}
    for k, v in new.items():
        setattr(n, k, v)
    try:
        grouped = lower_to_actors(phys, step.graph)
    finally:
        for k, v in old.items():
            setattr(n, k, v)
    assert all(2 not in ms for ms in grouped.alike.values())
    assert sorted(m for ms in grouped.alike.values() for m in ms) == [0, 1, 3]


@pytest.mark.parametrize("name,make", [(c[0], c[1]) for c in CASES[1:]], ids=[c[0] for c in CASES[1:]])
def test_members_kernels_are_made_when_asked(name, make):
    """A member of a group keeps its plain kernels unmade (``LazyRankPlan``) through the plan's checks, its
    communication order and a simulation, which predicts what the plan lowered rank by rank predicts; asked for,
    pickled for a worker or replaced, the rank is whole and equal to the one lowered on its own."""
    import pickle

    from sbplab.runtime.actor_plan import LazyRankPlan, RankPlan

    step = make()
    grouped = lower_to_actors(step.physical, step.graph, outputs=True)
    alone = lower_to_actors(step.physical, step.graph, outputs=True, by_group=False)
    lazy = [r for r, rp in grouped.ranks.items() if isinstance(rp, LazyRankPlan)]
    assert lazy and all(grouped.ranks[r]._fill is not None for r in lazy)
    assert any(a is None for a in grouped.ranks[lazy[0]]._slots)
    _, batch, comm = plan_of(step)
    hw = sl.Machine.a100_node()
    p1 = simulate_plan(grouped, hw, steps=2, batch=batch, comm=comm)
    assert all(grouped.ranks[r]._fill is not None for r in lazy)  # the simulator read no member's kernels
    p2 = simulate_plan(alone, hw, steps=2, batch=batch, comm=comm)
    assert p1.step_time == p2.step_time and p1.peak_memory == p2.peak_memory and p1.classes == p2.classes
    assert p1.measured_fraction == pytest.approx(p2.measured_fraction, rel=1e-12)
    def same(a, b) -> bool:
        return a.rank == b.rank and a.schedule == b.schedule and len(a.actors) == len(b.actors) and all(
            type(x) is type(y) and all(_same_value(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))
            for x, y in zip(a.actors, b.actors))

    r = lazy[-1]
    sent = pickle.loads(pickle.dumps(grouped.ranks[r]))  # what a worker gets: made whole on the way
    assert type(sent) is RankPlan and same(sent, alone.ranks[r])
    assert sent.by_name.keys() == alone.ranks[r].by_name.keys() and grouped.ranks[r]._fill is None
    assert same(dataclasses.replace(grouped.ranks[r]), alone.ranks[r])
    assert_same_plan(grouped, alone)
