"""n-D routes: the planner's Dijkstra equals an independent Bellman-Ford over all paths; caching."""

from __future__ import annotations

import itertools

import pytest
import torch

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.boxing.costs import edge_cost, time_scale
from sbplab.boxing.route import find_route
from sbplab.layout import LayoutError, check_layout
from sbplab.sbp import B, P, Partial, S


def _add(a, b):
    return tuple(x + y for x, y in zip(a, b))


def _graph(shape, pl, entries, hardware):
    """Every layout the tensor can have and every one-axis step between two of them."""
    states = []
    for s in itertools.product(entries, repeat=pl.ndim):
        try:
            check_layout(shape, pl, s)
        except LayoutError:
            continue
        states.append(s)
    ok = set(states)
    edges = []
    for u in states:
        for axis in range(pl.ndim):
            for x in entries:
                v = u[:axis] + (x,) + u[axis + 1:]
                if v == u or v not in ok:
                    continue
                c = edge_cost(shape, pl.shape, u, axis, x, 4, hardware)
                if c is not None:
                    edges.append((u, v, (c.ticks, sum(c.sent), 1)))
    return states, edges


def _bellman_ford(src, states, edges):
    """Minimum (time, bytes, steps) over all paths from src, lexicographically."""
    dist = {src: (0, 0, 0)}
    for _ in range(len(states)):
        changed = False
        for u, v, c in edges:
            if u in dist:
                k = _add(dist[u], c)
                if v not in dist or k < dist[v]:
                    dist[v] = k
                    changed = True
        if not changed:
            break
    return dist


CASES = [
    ("2x2", (5, 6), [[0, 1], [2, 3]], [S(0), S(1), B, P, P("max")], "cpu_box", 1),
    ("2x3", (6, 7), [[0, 1, 2], [3, 4, 5]], [S(0), S(1), B, P], "cpu_box", 1),
    ("4x2-ib", (8, 6), [[0, 1], [2, 3], [4, 5], [6, 7]], [S(0), S(1), B, P], "ib", 2),
    ("2x2x2", (4, 6), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [S(0), S(1), B, P], "cpu_box", 5),
    ("2x2x2-3d-ib", (3, 4, 5), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [S(0), S(1), S(2), B, P], "ib", 31),
]


@pytest.mark.parametrize("name,shape,ranks,entries,cl,every", CASES, ids=[c[0] for c in CASES])
def test_route_cost_equals_brute_force(name, shape, ranks, entries, cl, every):
    hardware = sl.Hardware.cpu_box() if cl == "cpu_box" else sl.Hardware.h100_ib(2)
    pl = sl.Placement("cpu", ranks)
    states, edges = _graph(shape, pl, entries, hardware)
    ops = {x.op for x in entries if isinstance(x, Partial)}
    checked = 0
    for src in states[::every]:
        dist = _bellman_ford(src, states, edges)
        assert set(dist) == set(states)  # every layout is reachable from every layout
        for dst in states:
            if {x.op for x in src + dst if isinstance(x, Partial)} - ops - {"sum"}:
                continue
            route = find_route(shape, src, dst, pl.shape, 4, hardware)
            assert route.key == dist[dst], (src, dst)
            plan = plan_boxing(shape, src, dst, pl, hardware=hardware)
            assert plan.total_bytes == dist[dst][1]
            assert len(plan.steps) == dist[dst][2]
            assert plan.time_s == pytest.approx(dist[dst][0] / time_scale(hardware), rel=1e-12, abs=1e-15)
            checked += 1
    assert checked >= len(states)


def test_same_sbp_is_an_empty_plan():
    pl = sl.Placement("cpu", [[0, 1], [2, 3]])
    plan = plan_boxing((4, 4), "S(0), B", (S(0), B), pl)
    assert plan.steps == () and plan.total_bytes == 0 and plan.time_s == 0
    assert "nothing to do" in plan.describe()
    x = torch.arange(16.0).reshape(4, 4)
    shards = sl.shard(x, pl, (S(0), B))
    out = plan.run(shards)
    assert all(torch.equal(out[r], shards[r]) and out[r] is not shards[r] for r in pl.rank_list)


def test_routes_are_cached_on_shape_sbps_mesh_and_cluster():
    find_route.cache_clear()
    a = sl.Placement("cpu", [[0, 1], [2, 3]])
    b = sl.Placement("cpu", [[4, 5], [6, 7]], axis_names=("dp", "tp"))
    p1 = plan_boxing((8, 8), "S(0), S(1)", "B, B", a)
    p2 = plan_boxing((8, 8), "S(0), S(1)", "B, B", b)  # other ranks, same mesh shape: same route
    info = find_route.cache_info()
    assert info.misses == 1 and info.hits == 1
    assert p1.kinds == p2.kinds and p1.total_bytes == p2.total_bytes
    assert p2.steps[0].groups != p1.steps[0].groups  # but the steps name the real ranks
    assert p2.steps[-1].axis_text() in ("dp", "tp")
    plan_boxing((8, 8), "S(0), S(1)", "B, B", a, hardware=sl.Hardware.h100_node())
    assert find_route.cache_info().misses == 2


def test_cluster_changes_the_route():
    """Across slow InfiniBand (axis 0) the planner reduces inside the node first."""
    pl = sl.Placement("cuda", [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]])
    plan = plan_boxing((64, 64), "P, P", "B, B", pl, hardware=sl.Hardware.h100_ib(2))
    first = plan.steps[0]
    assert first.mesh_axis == 1 and first.kind == "reduce_scatter"
    # across nodes only the 1/8 piece travels
    inter = [s for s in plan.steps if s.mesh_axis == 0]
    assert all(s.max_bytes_per_rank <= 64 * 64 * 4 // 8 * 2 for s in inter)


def test_describe_names_steps_axes_and_bytes():
    pl = sl.Placement("cpu", [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    plan = plan_boxing((8, 6), "P, S(1)", "B, B", pl)
    text = plan.describe()
    assert text.splitlines()[0].startswith("boxing f32[8, 6] (P, S(1)) -> (B, B)")
    for step in plan.steps:
        assert step.kind in text and step.axis_text() in text and step.why in text
    assert f"{plan.total_bytes} B" in text or "KB" in text
    assert repr(plan).startswith("BoxingPlan(")
