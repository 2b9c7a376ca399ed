"""One method on one flat space (a mesh and a ZeRO level): reduce, solve, expand to a signature per op.

``"auto"`` picks by size: enumeration when the space is tiny, the ILP while its edge tables stay
small enough for HiGHS to answer in seconds, coordinate descent beyond that.
"""

from __future__ import annotations

from .clock import Clock
from .descent import coordinate_descent
from .exhaustive import exhaustive
from .greedy import greedy_starts
from .ilp import solve_ilp
from .mcmc import metropolis
from .problem import OpProblem
from .shrink import reduce_problem

METHODS = ("auto", "exhaustive", "exact", "cd", "mcmc")
AUTO_EXHAUSTIVE = 1e4  # combinations
AUTO_ILP_PAIRS = 400_000  # edge-table entries
REDUCE_ABOVE = 40  # forward ops: above this, followers merge and repeated layers tie


def pick_method(pairs: int, space: float) -> str:
    if space <= AUTO_EXHAUSTIVE:
        return "exhaustive"
    return "exact" if pairs <= AUTO_ILP_PAIRS else "cd"


def solve_space(problem: OpProblem, zero: int, method: str, memory_limit: float | None, clock: Clock,
                seeds: list[list[int]], seed: int = 0, reduce: bool | None = None) -> tuple[list[int] | None, str]:
    """(a signature index per op, the method that ran), or (None, method) when nothing fits in memory.

    ``seeds`` are op-level starting points (presets on this mesh): local methods start from them, and
    every method's answer is compared with them, so a search never returns worse than its seeds.
    """
    big = len(problem.ops) > REDUCE_ABOVE if reduce is None else reduce
    r = reduce_problem(problem, zero, merge=big, tie=big)
    if method == "auto":
        method = pick_method(sum(d.size for d in r.edges.values()), r.space_size)
    starts = [r.contract(s) for s in seeds] + [[0] * len(r.cost)] + greedy_starts(r)
    label = method
    if method == "exhaustive":
        x = exhaustive(r, memory_limit, clock, label)
    elif method == "exact":
        left = clock.left()
        if left is not None and left <= 0:
            x = None
            clock.expired()
        else:
            res = solve_ilp(r, memory_limit, left)
            x = res.x
            if res.status == "time limit":
                clock.ran_out = True
            if x is not None:
                clock.record(label, r.total(x))
    elif method == "cd":
        x = coordinate_descent(r, starts, memory_limit, clock, label)
    elif method == "mcmc":
        x = metropolis(r, starts, memory_limit, clock, seed=seed, label=label)
    else:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    pool = ([r.expand(x)] if x is not None else []) + [r.expand(s) for s in starts] + [list(s) for s in seeds]
    fits = [a for a in pool if memory_limit is None or problem.memory(a, zero) <= memory_limit]
    if not fits:
        return None, method
    return min(fits, key=lambda a: problem.cost(a, zero)), method
