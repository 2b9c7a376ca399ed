"""The search prices gradient reductions as the runtime runs them (in buckets), a searched candidate
compiles to the plan its preset twin compiles to, and the re-rank never returns a strategy the simulator
predicts slower than a preset it simulated."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import sbplab as sl
from sbplab.compiler.deduction.strategy import DEFAULT_BUCKET_MB
from sbplab.ops.registry import TensorMeta
from sbplab.placement import Placement
from sbplab.sbp import B, P, S
from sbplab.search import search
from sbplab.search.box_prices import BoxPrices
from sbplab.search.cost import Pricer
from sbplab.search.mesh import MeshChoice
from sbplab.search.search_api import Space
from sbplab.search.to_strategy import strategy_for

CPU = sl.Hardware.cpu_box()


def _gpt():
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(vocab_size=128, block_size=32, n_layer=2, n_head=4, n_embd=64))
    (idx,), y = m.example_batch(16)
    return m, idx, y


def _pricer(ranks: int, bucket_mb: float) -> Pricer:
    m, idx, y = _gpt()
    space = Space(m, (idx,), m.loss_fn, y, sl.SGD(lr=0.1), CPU)
    return Pricer(space.graph(1), Placement("cpu", list(range(ranks))), CPU, BoxPrices(), bucket_mb=bucket_mb)


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_bucketed_reduction_pays_its_bandwidth_and_its_share_of_one_latency(ranks):
    alone, bucketed = _pricer(ranks, 0), _pricer(ranks, DEFAULT_BUCKET_MB)
    small = TensorMeta((64, 64), torch.float32)  # 16 KiB: a sliver of a 25 MiB bucket
    latency = CPU.axis_latency[0] * 2 * (ranks - 1)  # a ring all-reduce: 2 (p - 1) steps
    full = alone.grad_reduce_time(small, (P,), (B,))
    assert full == bucketed.box_time(small, (P,), (B,))  # without buckets: the planner's price
    assert bucketed.boxes.bucketable_latency(small, (P,), (B,)) == pytest.approx(latency)
    share = small.nbytes / (DEFAULT_BUCKET_MB * 2**20)
    assert bucketed.grad_reduce_time(small, (P,), (B,)) == pytest.approx(full - latency + share * latency)
    # reduce-scatter (ZeRO) is bucketed too; an all-gather never is, and a local change costs nothing
    assert bucketed.boxes.bucketable_latency(small, (P,), (S(0),)) == pytest.approx(CPU.axis_latency[0] * (ranks - 1))
    assert bucketed.boxes.bucketable_latency(small, (S(0),), (B,)) == 0.0
    assert bucketed.grad_reduce_time(small, (B,), (S(0),)) == 0.0
    # a gradient as large as a bucket pays its whole latency
    big = TensorMeta((DEFAULT_BUCKET_MB * 2**20 // 4,), torch.float32)
    assert bucketed.grad_reduce_time(big, (P,), (B,)) == pytest.approx(alone.grad_reduce_time(big, (P,), (B,)))


def _boxings(step) -> Counter:
    return Counter((b.phase, b.kind, b.src_sbp, b.dst_sbp) for b in step.deduction.boxings if b.plan.time_s > 0)


@pytest.mark.parametrize("zero,preset", [(0, "data parallel x2"), (2, "ZeRO-2 x2"), (3, "ZeRO-3 x2")])
def test_a_candidate_with_a_presets_choices_compiles_to_the_presets_plan(zero, preset):
    """The search's Strategy for the preset's own signatures and ZeRO level must box exactly as the preset
    does: no store hint that makes backward ops gather, updates and optimizer states on the shards under
    ZeRO, backward ops that mirror the forward ones (here, what deduction finds for the preset too)."""
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(n_blocks=2))
    (x,), y = m.example_batch(16)
    opt = sl.Adam()
    res = search(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, devices=2, hardware=CPU, pipelines=False,
                 rerank_top=0)
    p = next(c for c in res.presets if c.label == preset)
    twin = strategy_for(p.problem, p.assign, zero, "twin")
    compiled = [sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, strategy=st, hardware=CPU)
                for st in (twin, p.strategy)]
    assert _boxings(compiled[0]) == _boxings(compiled[1])
    assert compiled[0].physical.count() == compiled[1].physical.count()


def test_the_rerank_returns_nothing_the_simulator_predicts_slower_than_a_simulated_preset():
    m, idx, y = _gpt()
    res = search(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.05), devices=2, hardware=CPU)
    simulated = [p for p in res.presets if p.simulated_time is not None]
    # every preset within the memory limit, beside the rerank_top searched finalists, unless a floor under its
    # simulated time (``sim_floor.py``, ``deduced_floor.py``) shows it could not be the best preset
    best_preset = min(p.simulated_time for p in simulated)
    for p in res.presets:
        if p.step_time < float("inf") and p.simulated_time is None:
            assert p.sim_floor is not None and p.sim_floor > best_preset, p.describe()
    assert res.predicted.source == "simulator"
    assert res.predicted.step_time <= min(p.simulated_time for p in simulated)
    assert res.best_preset() in simulated
    if res.best.method == "preset":  # said, and not listed twice
        assert any("so the search returns it" in n for n in res.notes)
        assert [c.describe() for c in res.listed()].count(res.best.describe()) == 1
        assert "best preset itself" in res.explain()
    # the winner compiles and simulates to what the search said
    step = sl.compile(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.05), strategy=res.strategy,
                      hardware=res.hardware)
    assert sl.simulate(step, res.hardware).step_time == pytest.approx(res.predicted.step_time)


def test_mcmc_runs_one_chain_per_start_and_keeps_the_best_end():
    from sbplab.search.clock import Clock
    from sbplab.search.mcmc import metropolis
    from sbplab.search.shrink import reduce_problem

    m, idx, y = _gpt()
    space = Space(m, (idx,), m.loss_fn, y, sl.SGD(lr=0.1), CPU)
    pr = space.problem(MeshChoice((2,), (0,)))
    r = reduce_problem(pr, 0, merge=False, tie=False)
    zeros = [0] * len(r.cost)
    one = metropolis(r, [zeros], None, Clock(), seed=0, iterations=400)
    # the same chain from all-B, plus a second start: never worse than the first chain's end
    both = metropolis(r, [zeros, [len(c) - 1 for c in r.cost]], None, Clock(), seed=0, iterations=800)
    assert r.total(both) <= r.total(one) + 1e-15


@pytest.mark.parametrize("devices", [4, 8])
def test_forward_only_deduction_gives_the_full_deductions_forward_choices(devices):
    """The search prices presets from a deduction of their forward ops alone: greedy, in graph order,
    so no backward or update op can change what the forward ops got."""
    from sbplab.compiler.deduction.deduce import deduce
    from sbplab.search.presets_eval import applicable_presets

    m, idx, y = _gpt()
    space = Space(m, (idx,), m.loss_fn, y, sl.Adam(), sl.Hardware.h100_node())
    checked = 0
    for spec in applicable_presets(devices, space.batch, pipelines=True):
        g = space.graph(spec.micro_batches)
        full = deduce(g.copy(), spec.make(), space.hw)
        fwd = deduce(g.copy(), spec.make(), space.hw, forward_only=True)
        ops = g.ops_in("forward")
        assert {o.name: fwd.choices[o.name].signature for o in ops} == \
            {o.name: full.choices[o.name].signature for o in ops}, spec.name
        assert not any(o.name in fwd.choices for o in g.ops if o.phase != "forward")
        checked += 1
    assert checked >= 6


def test_a_searched_candidate_compiles_to_the_boxings_it_was_priced_with():
    """Backward ops mirror the forward choices (``backward_pins``) and a backward op that reads a boxed
    input boxes it again (``Pricer.rereads``), as deduction does: the activation and activation-gradient
    boxings of the compiled step cost what the search's edges said."""
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=64, width=1024, hidden=4096, n_blocks=2))
    (x,), y = m.example_batch(32)
    hw, opt = sl.Hardware.h100_node(), sl.SGD(lr=0.1)
    res = search(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, devices=4, hardware=hw, pipelines=False,
                 rerank_top=0)
    c = res.best
    priced = sum(e.cost[c.assign[e.src], c.assign[e.dst]] for e in c.problem.edges)
    assert priced > 0  # a split strategy, not the trivial all-replicated one
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, strategy=c.strategy,
                      hardware=c.mesh.hardware(hw))
    roles = {n: t.role for n, t in step.graph.tensors.items()}
    boxed = sum(b.plan.time_s for b in step.deduction.boxings
                if roles[b.tensor] not in ("param", "grad", "state") and b.phase != "update")
    assert boxed == pytest.approx(priced, rel=0.01)
    pinned = [h for h in c.strategy.signatures if "mirrors its forward op" in h.why]
    assert pinned and all(step.deduction.choices[h.pattern].signature == h.signature for h in pinned)


def test_the_winner_gets_the_bucket_size_the_simulator_predicts_fastest():
    from dataclasses import replace

    from sbplab.search.rerank import BUCKET_MB_CHOICES

    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=64, width=1024, hidden=4096, n_blocks=4))
    (x,), y = m.example_batch(32)
    hw, opt = sl.Hardware.h100_node(), sl.SGD(lr=0.1)
    res = search(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, devices=8, hardware=hw, pipelines=False)
    assert res.best.method != "preset", res.notes  # the searched strategy wins here, and is tuned
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, strategy=res.strategy,
                      hardware=res.hardware)
    assert step.strategy.bucket_mb == res.best.bucket_mb
    times = {mb: sl.simulate(replace(step, strategy=replace(step.strategy, bucket_mb=mb)), res.hardware).step_time
             for mb in BUCKET_MB_CHOICES}
    assert times[res.best.bucket_mb] == pytest.approx(min(times.values()))
    assert res.predicted.step_time == pytest.approx(times[res.best.bucket_mb])
    if res.best.bucket_mb != DEFAULT_BUCKET_MB:
        assert any("gradient buckets of" in n for n in res.notes) and "MiB buckets" in res.best.describe()
