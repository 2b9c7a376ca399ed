"""How fast is boxing route planning? Every pair of SBPs on a 2x2x2 mesh (goal: < 1 ms per route warm).

Three figures per route:
- cold:       all planner caches cleared before the route (a sample of pairs; the worst case);
- first time: the route itself was never planned, but earlier routes warmed the per-step costs
              (what a compiler sees while it explores many layouts of one tensor);
- warm:       the same request again (the route comes from the cache; the plan is rebuilt).

    .venv/bin/python benchmarks/bench_boxing_planner.py
"""

from __future__ import annotations

import itertools
import random
import statistics
import time

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.boxing.costs import edge_cost, state_ok, step_kinds
from sbplab.boxing.planner import _default_hardware, find_cross
from sbplab.boxing.route import find_route, routes_from, routes_to
from sbplab.boxing.state_graph import _has_kind, state_graph
from sbplab.boxing.ticks import kind_rate, tick_rate, time_scale
from sbplab.sbp import B, P, S

MESH = sl.Placement("cpu", [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
OTHER = sl.Placement("cpu", [[[8, 9], [10, 11]], [[12, 13], [14, 15]]])
SHAPE = (64, 48)
ENTRIES = [S(0), S(1), B, P, P("max")]
STATES = list(itertools.product(ENTRIES, repeat=3))
PAIRS = list(itertools.product(STATES, STATES))


def clear() -> None:
    for f in (edge_cost, state_ok, state_graph, find_route, routes_from, routes_to, find_cross, _has_kind,
              _default_hardware, step_kinds, kind_rate, tick_rate, time_scale):
        f.cache_clear()


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def summary(name: str, ts: list[float]) -> None:
    ts_ms = sorted(t * 1e3 for t in ts)
    p99 = ts_ms[min(len(ts_ms) - 1, int(0.99 * len(ts_ms)))]
    print(f"{name:<44} n={len(ts):>6}  median {statistics.median(ts_ms):8.3f} ms  p99 {p99:8.3f} ms  "
          f"max {ts_ms[-1]:8.3f} ms")


def main() -> None:
    print(f"{len(STATES)} SBPs of a {SHAPE} f32 tensor on a 2x2x2 mesh, {len(PAIRS)} ordered pairs, "
          f"entries {ENTRIES}")
    rng = random.Random(0)
    sample = rng.sample(PAIRS, 200)
    cold = []
    for a, b in sample:
        clear()
        cold.append(timed(lambda a=a, b=b: plan_boxing(SHAPE, a, b, MESH)))
    summary("cold (all caches cleared, 200 pairs)", cold)

    clear()
    first = [timed(lambda a=a, b=b: plan_boxing(SHAPE, a, b, MESH)) for a, b in PAIRS]
    summary("first time per route (all pairs)", first)

    warm = [timed(lambda a=a, b=b: plan_boxing(SHAPE, a, b, MESH)) for a, b in PAIRS]
    summary("warm plan_boxing (all pairs)", warm)
    cl = sl.Hardware.cpu_box()
    warm_route = [timed(lambda a=a, b=b: find_route(SHAPE, a, b, MESH.shape, 4, cl)) for a, b in PAIRS]
    summary("warm route lookup only (all pairs)", warm_route)
    steps = [len(plan_boxing(SHAPE, a, b, MESH).steps) for a, b in PAIRS]
    print(f"route length: mean {statistics.mean(steps):.2f} steps, max {max(steps)}")
    print(f"warm median vs 1 ms goal: {statistics.median(warm) * 1e3:.3f}x of the budget")

    cross = rng.sample(PAIRS, 100)
    clear()
    first_x = [timed(lambda a=a, b=b: plan_boxing(SHAPE, a, b, MESH, OTHER)) for a, b in cross]
    summary("across placements 2x2x2 -> 8 other ranks, first", first_x)
    warm_x = [timed(lambda a=a, b=b: plan_boxing(SHAPE, a, b, MESH, OTHER)) for a, b in cross]
    summary("across placements, warm", warm_x)


if __name__ == "__main__":
    main()
