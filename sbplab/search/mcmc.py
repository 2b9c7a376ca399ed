"""``"mcmc"``: FlexFlow's Metropolis-Hastings search. Propose a random group's random new choice;
price only that group and its edges (the delta); accept with probability min(1, exp(-beta * delta /
cost)), the delta taken relative to the current step time so ``beta`` does not depend on units. The
best state ever visited wins. Memory over the limit counts as time at a steep price per byte."""

from __future__ import annotations

import math
import random

from .clock import Clock
from .descent import descend
from .local_moves import LocalView
from .shrink import Reduced


def metropolis(r: Reduced, start: list[int], memory_limit: float | None, clock: Clock, seed: int = 0,
               iterations: int | None = None, beta: float = 60.0, label: str = "mcmc") -> list[int]:
    rng = random.Random(seed)
    view = LocalView(r, memory_limit)
    x = list(start)
    cost, mem = r.total(x), r.mem(x)
    scale = max(cost, 1e-12)
    penalty = 100 * scale / memory_limit if memory_limit else 0.0  # seconds per byte over the limit

    def energy(c: float, m: int) -> float:
        return c + penalty * view.excess(m)

    e = energy(cost, mem)
    best, best_e = list(x), e
    movable = [g for g, c in enumerate(r.cost) if len(c) > 1]
    n = iterations if iterations is not None else min(40000, 400 * max(1, len(movable)))
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
    best = descend(r, best, memory_limit, clock)
    clock.record(label, r.total(best) if view.excess(r.mem(best)) == 0 else float("inf"))
    return best
