"""``"mcmc"``: FlexFlow's Metropolis-Hastings search. Propose a random group's random new choice;
price only that group and its edges (the delta); accept with probability min(1, exp(-beta * delta /
cost)), the delta taken relative to the current step time so ``beta`` does not depend on units. The
best state ever visited wins. Memory over the limit counts as time at a steep price per byte.

As FlexFlow starts from data parallelism and from expert strategies, one chain starts from each given
start (the presets' choices on this mesh, the all-replicated one), sharing the iterations; each ends
with a greedy descent, and the best end point wins. A single chain from the cheapest start can sit in
that start's basin when the better optimum needs several ops to change together."""

from __future__ import annotations

import math
import random

from .clock import Clock
from .descent import descend
from .local_moves import LocalView
from .shrink import Reduced


def metropolis(r: Reduced, starts: list[list[int]], memory_limit: float | None, clock: Clock, seed: int = 0,
               iterations: int | None = None, beta: float = 60.0, label: str = "mcmc") -> list[int]:
    """The best end point of one chain per start (see the module docstring)."""
    view = LocalView(r, memory_limit)
    movable = [g for g, c in enumerate(r.cost) if len(c) > 1]
    n = iterations if iterations is not None else min(40000, 400 * max(1, len(movable)))
    distinct = list(dict.fromkeys(tuple(s) for s in starts))
    ends = []
    for k, start in enumerate(distinct):
        ends.append(_chain(r, list(start), view, movable, n // len(distinct), beta, memory_limit, clock,
                           random.Random(seed + 7919 * k)))
        if clock.expired():
            break
    best = min(ends, key=view.score)
    clock.record(label, r.total(best) if view.excess(r.mem(best)) == 0 else float("inf"))
    return best


def _chain(r: Reduced, start: list[int], view: LocalView, movable: list[int], n: int, beta: float,
           memory_limit: float | None, clock: Clock, rng: random.Random) -> list[int]:
    x = list(start)
    cost, mem = r.total(x), r.mem(x)
    scale = max(cost, 1e-12)
    penalty = 100 * scale / memory_limit if memory_limit else 0.0  # seconds per byte over the limit

    def energy(c: float, m: int) -> float:
        return c + penalty * view.excess(m)

    e = energy(cost, mem)
    best, best_e = list(x), e
    for it in range(n):
        if not movable or (it % 256 == 0 and clock.expired()):
            break
        g = rng.choice(movable)
        cur = x[g]
        new = rng.randrange(len(r.cost[g]) - 1)
        new += new >= cur
        opts = view.options(x, g)
        new_cost = cost + float(opts[new] - opts[cur])
        new_mem = mem - int(r.memory[g][cur]) + int(r.memory[g][new])
        ne = energy(new_cost, new_mem)
        delta = ne - e
        if delta <= 0 or rng.random() < math.exp(-beta * delta / max(e, 1e-12)):
            x[g], cost, mem, e = new, new_cost, new_mem, ne
            if e < best_e - 1e-15:
                best, best_e = list(x), e
    return descend(r, best, memory_limit, clock)
