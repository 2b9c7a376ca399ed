"""Greedy starting points for the local methods (``cd``, ``mcmc``): one per choice of the first variable.

A local method changes one variable at a time, so it cannot leave a basin whose way out needs many
ops to change together: from all-replicated, splitting the batch pays an all-gather at every op that
changes alone, though splitting it everywhere costs nothing at all. A greedy pass in graph order, each
variable taking its cheapest choice given the choices before it, carries the first variable's choice
through the graph (a batch split at the input stays a batch split while it is free), so a start per
choice of the first variable puts every "split this way from the input on" strategy among the starts.
"""

from __future__ import annotations

import numpy as np

from .shrink import Reduced


def greedy_starts(r: Reduced) -> list[list[int]]:
    """A greedy assignment for each choice of group 0 (empty for an empty problem)."""
    if not r.cost:
        return []
    into: dict[int, list[tuple[int, np.ndarray]]] = {}  # group -> (earlier group, edge table [a, b])
    for (a, b), d in r.edges.items():
        into.setdefault(b, []).append((a, d))
    starts = []
    for first in range(len(r.cost[0])):
        x = [first] + [0] * (len(r.cost) - 1)
        for g in range(1, len(r.cost)):
            price = r.cost[g].copy()
            for a, d in into.get(g, ()):
                price += d[x[a]]
            x[g] = int(np.argmin(price))
        starts.append(x)
    return starts
