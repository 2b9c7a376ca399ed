"""The search's shared price tables give exactly what the one-at-a-time code gives: boxing seconds equal
``plan_boxing``'s, identical layers share (read-only) tables, a step's per-rank bytes equal each rank's
own count, and the ILP answers like enumeration whether or not its relaxation is integral."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.boxing.costs import edge_cost, extents
from sbplab.boxing.kinds import kinds_between
from sbplab.boxing.route import candidates, partial_ops
from sbplab.compiler.deduction.deduce import is_local_change
from sbplab.sbp import B
from sbplab.search.box_floors import FloorBoxes
from sbplab.search.clock import Clock
from sbplab.search.cost import ZERO_LEVELS
from sbplab.search.exhaustive import exhaustive
from sbplab.search.ilp import solve_ilp
from sbplab.search.mesh import mesh_choices
from sbplab.search.problem import floor_edges, price_ops
from sbplab.search.search_api import Space, _pipeline_spaces, _pipelines, search
from sbplab.search.search_progress import ProgressReporter
from sbplab.search.shrink import Reduced
from sbplab.search.stage_floor import StageFloor


def _gpt_space(hw: sl.Hardware) -> Space:
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(n_layer=2))
    (idx,), y = m.example_batch(8)
    return Space(m, (idx,), m.loss_fn, y, sl.Adam(), hw)


@pytest.mark.parametrize("devices,hw", [(4, sl.Hardware.h100_node()), (8, sl.Hardware.h100_ib(2))],
                         ids=["one-link", "two-links"])
def test_box_prices_equal_the_planners_time_for_every_pair_asked(devices, hw):
    space = _gpt_space(hw)
    for mesh in mesh_choices(devices, hw):
        space.problem(mesh)
    checked = 0
    for (_, view), tables in space.boxes._meshes.items():
        for meta, table in tables.items():
            rows = [((src, dst), t) for (src, ops), row in table._rows.items() for dst, t in row.items()
                    if partial_ops(src, dst) == ops]  # what ``matrix`` reads off a row
            for k, ((src, dst), t) in enumerate([*table._times.items(), *rows]):
                if k % 5:  # a fifth of the pairs keeps the test quick; every kind of pair is among them
                    continue
                if is_local_change(src, dst):  # a local slice or fill: the search counts it free, as before
                    assert t == 0.0
                    continue
                plan = plan_boxing(meta.shape, src, dst, table.placement, dtype=meta.dtype, hardware=view)
                assert t == plan.time_s, (meta, src, dst)
                checked += 1
    assert checked > 2000


def test_identical_layers_share_read_only_price_tables():
    space = _gpt_space(sl.Hardware.h100_node())
    pr = space.problem(mesh_choices(4, space.hw)[1])  # a 2x2 mesh
    layer = {u: [k for k, o in enumerate(pr.ops) if o.unit == u] for u in ("blocks.0", "blocks.1")}
    assert len(layer["blocks.0"]) == len(layer["blocks.1"]) > 10
    twin = dict(zip(layer["blocks.0"], layer["blocks.1"]))  # op k of layer 0 -> the same op of layer 1
    shared = 0
    for k, k1 in twin.items():
        a, b = pr.ops[k], pr.ops[k1]
        assert a.op.type == b.op.type and a.sigs == b.sigs
        arrays = lambda o: [o.compute, o.activation, *o.gather.values(), *o.sync.values(), *o.memory.values()]  # noqa: E731
        if a.compute is b.compute:
            assert all(x is y for x, y in zip(arrays(a), arrays(b)))
            shared += 1
        else:  # priced apart only where the prices differ (the last block's output feeds ln_f, not a block)
            assert not all(np.array_equal(x, y) for x, y in zip(arrays(a), arrays(b))), a.name
        assert not a.compute.flags.writeable
        with pytest.raises(ValueError):
            a.compute[0] = 0.0
    assert shared >= len(twin) - 2
    edges = {(e.src, e.dst): e for e in pr.edges}
    inside = [(e, edges[(twin[s], twin[d])]) for (s, d), e in edges.items() if s in twin and d in twin]
    assert len(inside) > 10
    assert sum(e.cost is f.cost for e, f in inside) >= len(inside) - 2
    assert all(e.cost is f.cost or not np.array_equal(e.cost, f.cost) for e, f in inside)


@pytest.mark.parametrize("mesh", [(3,), (2, 3), (2, 2)])
def test_step_bytes_are_each_ranks_own_count_on_uneven_splits(mesh):
    shape, itemsize = (7, 5, 6), 4
    hw = sl.Hardware.h100_node()
    cands = candidates(len(shape), ("sum",))
    seen = 0
    for state in itertools.product(cands, repeat=len(mesh)):
        for axis, new in itertools.product(range(len(mesh)), cands):
            c = edge_cost(shape, mesh, state, axis, new, itemsize, hw)
            if c is None:
                continue
            kind = next(k for k in kinds_between(state[axis], new) if k.name == c.kind)
            whole = state[:axis] + (B,) + state[axis + 1:]
            want = [kind.rank_elements(extents(shape, mesh, whole, co), state[axis], new, mesh[axis], co[axis])
                    for co in np.ndindex(*mesh)]
            assert c.sent == tuple(s * itemsize for s, _, _ in want)
            assert c.recv == tuple(r * itemsize for _, r, _ in want)
            seen += 1
    assert seen >= 20


def _frustrated_triangle() -> Reduced:
    """Three binary choices, each pair paying 1 when equal: every 0/1 point pays at least 1, while the
    relaxation pays 0 at x = 1/2 (so the LP answer is fractional and branch and bound must run)."""
    same = np.array([[1.0, 0.0], [0.0, 1.0]])
    cost = [np.array([0.0, 0.01]), np.array([0.0, 0.02]), np.array([0.0, 0.03])]
    memory = [np.array([5, 1]), np.array([5, 1]), np.array([5, 1])]
    edges = {(0, 1): same, (1, 2): same, (0, 2): same}
    return Reduced(SimpleNamespace(base_memory=0), 0, cost, memory, edges, [0, 1, 2], [np.arange(2)] * 3)


def test_ilp_with_a_fractional_relaxation_matches_enumeration():
    r = _frustrated_triangle()
    res = solve_ilp(r)
    best = exhaustive(r, None, Clock())
    assert res.status == "optimal"
    assert res.objective == pytest.approx(r.total(best)) == pytest.approx(1.01)  # x = (1, 0, 0); rounding 1/2 pays 3
    limited = solve_ilp(r, memory_limit=7)  # at most one choice 0: x = (1, 1, 0) pays 1.03, the cheapest such
    assert limited.objective == pytest.approx(r.total(exhaustive(r, 7, Clock()))) == pytest.approx(1.03)
    assert r.mem(limited.x) <= 7
    none = solve_ilp(r, memory_limit=2)  # below the least memory (3): the relaxation already says so
    assert none.x is None and none.status == "infeasible"


@pytest.mark.parametrize("devices,hw", [(4, sl.Hardware.h100_node()), (8, sl.Hardware.h100_ib(2)),
                                        (6, sl.Hardware.cpu_box())], ids=["one-link", "two-links", "uneven"])
def test_boxing_floors_are_never_above_a_price_and_close_to_most(devices, hw):
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(n_layer=2))
    (idx,), y = m.example_batch(12 if devices == 6 else 8)  # 6 ranks: uneven splits of 4 heads, 12 rows
    space = Space(m, (idx,), m.loss_fn, y, sl.Adam(), hw)
    for mesh in mesh_choices(devices, hw):
        pr = space.problem(mesh)
        floors = floor_edges(price_ops(space.graph(1), mesh, hw))  # the same edges, in the same order
        assert [(e.src, e.dst) for e in floors] == [(e.src, e.dst) for e in pr.edges]
        assert all((f.cost <= e.cost).all() for f, e in zip(floors, pr.edges)), mesh
    ratios = []
    for (_, view), tables in space.boxes._meshes.items():
        for meta, table in tables.items():
            floor = FloorBoxes().for_mesh(table.placement, view)
            pairs = [*table._times.items(), *(((src, dst), t) for (src, ops), row in table._rows.items()
                                              for dst, t in row.items() if partial_ops(src, dst) == ops)]
            for (src, dst), t in pairs:
                f = floor.time(meta, src, dst)
                assert 0.0 <= f <= t, (meta, src, dst)
                if t > 0:
                    ratios.append(f / t)
    assert len(ratios) > 5000 and np.median(ratios) > 0.9  # tight enough to skip spaces on


@pytest.mark.parametrize("devices,hw,node", [(4, sl.Hardware.h100_node(), None), (8, sl.Hardware.h100_ib(2), 4)],
                         ids=["one-link", "two-links"])
def test_pipeline_spaces_skipped_by_their_bound_could_not_have_won(devices, hw, node):
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(n_layer=4))
    (idx,), y = m.example_batch(16)
    space = Space(m, (idx,), m.loss_fn, y, sl.Adam(), hw)
    spaces = _pipeline_spaces(space, devices, node)

    def run(keep: int, notes: list[str]) -> list:
        clock = Clock()
        return _pipelines(space, "exact", None, clock, 0, ZERO_LEVELS, False, [], ProgressReporter(None, clock, None),
                          spaces, [], keep, notes)

    every = run(10**9, [])
    assert len(every) == len(spaces) * len(ZERO_LEVELS)
    charged = 0
    for c in every:  # the bounds are ones: no cut of any assignment goes below them
        S, M = c.n_stages, c.micro_batches
        floor = space.stage_floor(c.mesh, M).value(c.zero, M + S - 1) / S  # edges at their floors
        real = StageFloor(c.problem.ops, c.problem.edges).value(c.zero, M + S - 1) / S  # at their prices
        assert floor <= c.step_time and real <= c.step_time, c.describe()
        # with the moves of S - 1 cuts; then from the whole batch's graph, with what a micro-batch pays whole
        cuts = StageFloor(c.problem.ops, c.problem.edges).value(c.zero, M + S - 1, S) / S
        moved, real1 = space.moved_floor(c.mesh, S, M, c.zero), space.real_pre_floor(c.mesh, S, M, c.zero)
        flat = space.flat_floor(S, M, c.mesh.size * S)  # one-device prices, with the cuts' moves at 1/k
        assert max(cuts, moved, real1, flat) <= c.step_time, c.describe()
        charged += cuts > real
    assert charged == len(every)  # every cut moves an activation
    res = search(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.Adam(), devices=devices, hardware=hw,
                 method="exact", node_size=node, reduce=False, rerank_top=0)
    assert any("skipped unsolved" in n for n in res.notes), res.notes
    one_stage = [c for c in res.candidates if c.n_stages == 1]
    assert len(res.candidates) < len(one_stage) + len(every)
    assert res.best.step_time == min(c.step_time for c in one_stage + every)
