"""The floors that let the search skip work at real sizes are floors: a finalist the re-rank does not
simulate would not have been chosen (``sim_floor.py``), and a pipeline space skipped before its
micro-batch graph is traced is priced above its floor once it is traced (``Space.pre_floor``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import sbplab as sl
from sbplab.search import search
from sbplab.search.mesh import MeshChoice, mesh_choices
from sbplab.search.problem import latency_edges
from sbplab.search.rerank import simulate_candidate
from sbplab.search.search_api import Space, _real_floor
from sbplab.search.sim_floor import MARGIN, sim_floor
from sbplab.search.stage_floor import micro_edges

H100 = sl.Hardware.h100_node()
# a device a thousand times slower than an H100 with the same links: compute dominates, as at real sizes
SLOW = replace(H100, name="slow device", flops=H100.flops / 1000, flops_bf16=None, mem_bandwidth=H100.mem_bandwidth / 1000)


def _gpt(batch: int = 16):
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=128))
    (idx,), y = m.example_batch(batch)
    return m, idx, y


@pytest.fixture(scope="module")
def searched():
    m, idx, y = _gpt()
    res = search(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), devices=8, hardware=SLOW,
                 method="cd", rerank_top=2)
    return m, idx, y, res


def test_no_simulated_finalist_is_below_its_floor(searched):
    *_, res = searched
    done = [c for c in (*res.candidates, *res.presets) if c.simulated_time is not None]
    assert len(done) >= 3
    for c in done:
        f = sim_floor(c, SLOW)  # the simulator's 3-step window may come out a little below a long run's floor
        assert 0 < f * (1 - MARGIN) <= c.simulated_time, c.describe()


def test_a_finalist_not_simulated_could_not_have_been_chosen(searched):
    m, idx, y, res = searched
    best = res.best.simulated_time
    best_preset = min(p.simulated_time for p in res.presets if p.simulated_time is not None)
    skipped = [c for c in (*res.candidates, *res.presets) if c.sim_floor is not None]
    assert skipped  # Megatron tensor parallel: 4 heads do not divide over 8 ranks, so attention runs whole
    for c in skipped:  # each is listed at its floor, labelled, and simulating it now confirms the floor
        assert c.simulated_time is None and c.sim_floor * (1 - MARGIN) > best
        if c.method == "preset":
            assert c.sim_floor * (1 - MARGIN) > best_preset
            row = next(r for r in res.rows() if r["strategy"] == c.describe())
            assert row["at_least"] and row["model"].startswith("simulated floor")
        t, _ = simulate_candidate(c, m, (idx,), m.loss_fn, y, sl.SGD(lr=0.1), SLOW)
        assert t >= c.sim_floor * (1 - MARGIN) and t > best
    # every preset is either simulated or skipped by its floor, and the note says which and why
    assert all(p.simulated_time is not None or p.sim_floor is not None for p in res.presets)
    assert any("not simulated" in n and skipped[0].label in n for n in res.notes)


@pytest.mark.parametrize("machine", [False, True])
def test_a_pipeline_floor_from_the_whole_batch_is_below_the_micro_batch_one(machine):
    hw = sl.Machine.h100_node() if machine else H100  # GEMM efficiency rising with size, or spec-sheet peaks
    m, idx, y = _gpt(batch=32)
    space = Space(m, (idx,), m.loss_fn, y, sl.SGD(lr=0.1), hw)
    checked = 0
    for S, M in ((2, 4), (2, 8), (4, 8)):
        for mesh in mesh_choices(8 // S, hw):
            for z in (0, 2, 3):
                pre = space.pre_floor(mesh, S, M, z)
                flat = space.flat_floor(S, M, 8)  # one figure for every stage mesh and ZeRO level, with cuts
                assert 0 < flat <= space.moved_floor(mesh, S, M, z) * (1 + 1e-9), (S, M, mesh, z)
                traced = space.stage_floor(mesh, M).value(z, M + S - 1) / S  # the micro-batch graph traced
                plain = space.stage_floor(mesh, 1).value(z, (M + S - 1) / M) / S  # every term at 1/M
                assert plain * (1 - 1e-9) <= pre <= traced * (1 + 1e-9), (S, M, mesh, z)
                real1 = space.real_pre_floor(mesh, S, M, z)  # real edges, still the whole batch's graph
                real = _real_floor(space.problem(mesh, M)).value(z, M + S - 1, S) / S  # the same on the traced
                assert pre * (1 - 1e-9) <= real1 <= real * (1 + 1e-9), (S, M, mesh, z)
                checked += 1
    assert checked >= 9
    # what the tighter floor is for: a small micro-batch does not run at the whole batch's efficiency
    mesh = MeshChoice((2,), (0,))
    if machine:
        assert space.pre_floor(mesh, 4, 8, 0) > space.stage_floor(mesh, 1).value(0, 11 / 8) / 4 * 1.01


@pytest.mark.parametrize("machine", [False, True])
def test_what_every_micro_batch_pays_whole_is_below_m_times_its_price(machine):
    """``micro_edges``: each whole-batch edge plus (M - 1) x its least latency rounds (and each move plus (M - 1)
    x its messages' latency) is below M times the same edge of the traced micro-batch graph, signature for
    signature; so is the one-micro-batch graph's op at 1/M of the work, times M (``_micro_ops``)."""
    hw = sl.Machine.h100_node() if machine else H100
    m, idx, y = _gpt(batch=32)
    space = Space(m, (idx,), m.loss_fn, y, sl.SGD(lr=0.1), hw)
    lifted = 0
    for S, M in ((2, 8), (4, 8)):
        for mesh in mesh_choices(8 // S, hw):
            whole, micro = space.problem(mesh), space.problem(mesh, M)  # 4 samples a micro-batch
            lat = latency_edges(whole)
            for e, f, low in zip(micro_edges(whole.edges, lat, M), micro.edges, lat, strict=True):
                assert (whole.ops[e.src].name, whole.ops[e.dst].name, e.tensor) == \
                    (micro.ops[f.src].name, micro.ops[f.dst].name, f.tensor)
                rows = [whole.ops[e.src].sigs.index(s) for s in micro.ops[f.src].sigs]
                cols = [whole.ops[e.dst].sigs.index(s) for s in micro.ops[f.dst].sigs]
                assert (e.cost[np.ix_(rows, cols)] <= M * f.cost * (1 + 1e-9)).all(), e.tensor
                if e.cross_stage is not None:
                    assert (e.cross_stage[rows] <= M * f.cross_stage * (1 + 1e-9)).all(), e.tensor
                lifted += int((low.cost > 0).any())
            for o, p in zip(space._micro_ops(mesh, M), micro.ops, strict=True):
                rows = [o.sigs.index(s) for s in p.sigs]
                for z in (0, 2, 3):
                    assert (o.compute[rows] + o.gather[z][rows] <= M * (p.compute + p.gather[z]) * (1 + 1e-9)).all()
    assert lifted > 10  # boxings with latency: the term is there to be checked
