"""What coordinate descent and MCMC share: one group's cost for each of its choices given its
neighbours' current choices (only the group and its edges are re-priced: the delta evaluation), and
a memory excess that both treat as worse than any time."""

from __future__ import annotations

import numpy as np

from .shrink import Reduced


class LocalView:
    """Incremental cost of a choice vector of a ``Reduced`` problem."""

    def __init__(self, r: Reduced, memory_limit: float | None) -> None:
        self.r = r
        self.limit = memory_limit
        self.adj: list[list[tuple[int, np.ndarray]]] = [[] for _ in r.cost]  # g -> (h, D[choice g, choice h])
        for (a, b), d in r.edges.items():
            self.adj[a].append((b, d))
            self.adj[b].append((a, d.T))

    def options(self, x: list[int], g: int) -> np.ndarray:
        """Seconds per step attributable to group ``g`` for each of its choices, others fixed."""
        v = self.r.cost[g].copy()
        for h, d in self.adj[g]:
            v += d[:, x[h]]
        return v

    def excess(self, mem: int) -> float:
        return 0.0 if self.limit is None else max(0.0, mem - self.limit)

    def score(self, x: list[int]) -> tuple[float, float]:
        """(bytes over the memory limit, seconds per step): smaller is better, memory first."""
        return self.excess(self.r.mem(x)), self.r.total(x)
