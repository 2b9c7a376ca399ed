"""``"exhaustive"``: price every combination (vectorised in chunks). The ground truth for tests on
tiny graphs; refused above ``EXHAUSTIVE_LIMIT`` combinations with an error that says how many there are."""

from __future__ import annotations

import numpy as np

from .clock import Clock
from .search_errors import SearchError
from .shrink import Reduced

EXHAUSTIVE_LIMIT = 5_000_000
CHUNK = 200_000


def exhaustive(r: Reduced, memory_limit: float | None, clock: Clock, label: str = "exhaustive") -> list[int] | None:
    """The cheapest combination within the memory limit, or None when none fits."""
    sizes = r.sizes
    total = r.space_size
    if total > EXHAUSTIVE_LIMIT:
        raise SearchError(f"sl.search(method='exhaustive'): {total:.3g} combinations of signatures on mesh "
                          f"{r.problem.mesh.shape} (ops: {len(r.problem.ops)}), more than the {EXHAUSTIVE_LIMIT:,} "
                          f"it enumerates; use method='exact' (same answer, an ILP) or 'auto'")
    best, best_cost = None, np.inf
    n = int(total)
    for lo in range(0, n, CHUNK):
        if clock.expired():
            break
        idx = np.arange(lo, min(n, lo + CHUNK))
        digits = np.unravel_index(idx, sizes)
        cost = np.zeros(len(idx))
        mem = np.full(len(idx), r.problem.base_memory, dtype=np.int64)
        for g, c in enumerate(r.cost):
            cost += c[digits[g]]
            mem += r.memory[g][digits[g]]
        for (a, b), d in r.edges.items():
            cost += d[digits[a], digits[b]]
        if memory_limit is not None:
            cost[mem > memory_limit] = np.inf
        k = int(np.argmin(cost))
        if cost[k] < best_cost:
            best_cost = float(cost[k])
            best = [int(d[k]) for d in digits]
            clock.record(label, best_cost)
    return best
