"""``"exact"``: Alpa's integer linear program over one mesh, solved by HiGHS (``scipy.optimize.milp``).

Variables: ``x[g, c]`` in {0, 1}, one-hot per group (``sum_c x[g, c] = 1``); per edge (a, b) and pair
of choices (c, d) with a positive resharding cost, ``e[ab, cd]`` in [0, 1] with
``e >= x[a, c] + x[b, d] - 1`` (the product x[a, c] * x[b, d], linearised: minimising drives it to
exactly that product). Objective: node costs plus edge costs. Memory: ``sum memory[g, c] x[g, c] <=
limit``. Pairs of cost zero need no variable. The LP relaxation of that linearisation is weak, so
``tight=True`` (the default) also adds the marginal constraints ``sum_d e[ab, cd] = x[a, c]`` and
``sum_c e[ab, cd] = x[b, d]`` over every pair, which the same optimum satisfies and which make the
relaxation nearly integral on layer stacks.

An edge's cost depends on a choice only through the layout it gives the tensor on that edge, so many
rows (and columns) of an edge table are equal. The tight form therefore works on classes of equal rows
``p`` and equal columns ``q``: ``e[ab, pq]`` with ``sum_q e[ab, pq] = sum_{c in p} x[a, c]`` and
``sum_p e[ab, pq] = sum_{d in q} x[b, d]``. For 0/1 choices that is the same product, and its LP
relaxation is the same (spread ``e[ab, pq]`` over the pairs of its classes in proportion to ``x`` to go
back), so the optimum is unchanged; the model is a fraction of the size (a GPT block on a 2-D mesh:
about 30 000 variables instead of 118 000) and HiGHS answers several times sooner.

Because that relaxation is nearly integral, HiGHS first solves it as a plain LP (``linprog``): when
every choice comes out 0 or 1, that point is feasible for the integer program and no integer point can
cost less than the relaxation's optimum, so it is an optimum of the integer program (a GPT on a 2-D
mesh: a tenth of a second instead of half a second or more). Otherwise branch and bound (``milp``)
runs as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .shrink import Reduced

INTEGRAL_TOL = 1e-6  # a relaxed choice this close to 0 or 1 counts as integral


@dataclass
class IlpResult:
    x: list[int] | None  # a choice per group, None when infeasible
    objective: float
    status: str  # "optimal", "time limit" (best found so far), "infeasible"
    variables: int


def _classes(d: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(class of each row (axis 0) or column (axis 1) of ``d``, the first index of each class): equal
    rows or columns share a class."""
    _, first, inverse = np.unique(d, axis=axis, return_index=True, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), first.astype(np.int64)


def solve_ilp(r: Reduced, memory_limit: float | None = None, time_limit: float | None = None,
              tight: bool = True) -> IlpResult:
    """The cheapest choice per group of ``r`` within ``memory_limit`` bytes per device."""
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp  # scipy loads when an ILP is solved
    from scipy.sparse import coo_matrix

    sizes = r.sizes
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    nx = int(off[-1])
    c = [np.concatenate(r.cost)]
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []
    n_con = 0

    def add(rr, cc, vv, lower, upper):
        nonlocal n_con
        rows.append(np.asarray(rr, dtype=np.int64) + n_con)
        cols.append(np.asarray(cc, dtype=np.int64))
        vals.append(np.asarray(vv, dtype=float))
        n = len(lower)
        lo.extend(lower)
        hi.extend(upper)
        n_con += n

    for g, n in enumerate(sizes):  # one-hot
        add(np.zeros(n), off[g] + np.arange(n), np.ones(n), [1.0], [1.0])
    nv = nx
    for (a, b), d in r.edges.items():
        na, nb = d.shape
        if tight:
            row_of, rows_u = _classes(d, 0)  # choice of a -> its class p; one representative per class
            col_of, cols_u = _classes(d, 1)
            P, Q = len(rows_u), len(cols_u)
            ids = nv + np.arange(P * Q).reshape(P, Q)
            c.append(d[np.ix_(rows_u, cols_u)].reshape(-1))
            nv += P * Q
            # sum_q e[p, q] - sum_{c in p} x[a, c] = 0 ; sum_p e[p, q] - sum_{d in q} x[b, d] = 0
            rr = np.concatenate([np.repeat(np.arange(P), Q), row_of])
            add(rr, np.concatenate([ids.reshape(-1), off[a] + np.arange(na)]),
                np.concatenate([np.ones(P * Q), -np.ones(na)]), [0.0] * P, [0.0] * P)
            rr = np.concatenate([np.tile(np.arange(Q), P), col_of])
            add(rr, np.concatenate([ids.reshape(-1), off[b] + np.arange(nb)]),
                np.concatenate([np.ones(P * Q), -np.ones(nb)]), [0.0] * Q, [0.0] * Q)
        else:
            ci, di = np.nonzero(d > 0)
            k = len(ci)
            if not k:
                continue
            ids = nv + np.arange(k)
            c.append(d[ci, di])
            nv += k
            # x[a, c] + x[b, d] - e <= 1
            rr = np.concatenate([np.arange(k)] * 3)
            add(rr, np.concatenate([off[a] + ci, off[b] + di, ids]),
                np.concatenate([np.ones(k), np.ones(k), -np.ones(k)]), [-np.inf] * k, [1.0] * k)
    if memory_limit is not None:
        add(np.zeros(nx), np.arange(nx), np.concatenate(r.memory).astype(float), [-np.inf],
            [float(memory_limit) - r.problem.base_memory])
    A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_con, nv)).tocsr()
    cost = np.concatenate(c) * 1e6  # microseconds: HiGHS's absolute gap (1e-6) is then negligible
    cons = LinearConstraint(A, lo, hi)
    start = time.perf_counter()
    # The relaxation first (without presolve, which costs more than it saves here): where its optimum
    # is already 0/1 in every choice it is an optimum of the integer program too (the edge variables
    # then equal their products), and branch and bound is not needed.
    lo_a, hi_a = np.asarray(lo), np.asarray(hi)
    eq = lo_a == hi_a  # one-hot and marginal rows; the memory row is the only inequality
    ub = None if eq.all() else ~eq
    lp = linprog(cost, A_eq=A[eq], b_eq=lo_a[eq], A_ub=None if ub is None else A[ub],
                 b_ub=None if ub is None else hi_a[ub], bounds=(0, 1), method="highs",
                 options=_options(time_limit, presolve=False))
    if lp.status == 2:  # the relaxation is infeasible, so is the integer program
        return IlpResult(None, float("inf"), "infeasible", nv)
    if lp.status == 0 and lp.x is not None and np.abs(lp.x[:nx] - np.round(lp.x[:nx])).max(initial=0.0) <= INTEGRAL_TOL:
        x = [int(np.argmax(lp.x[off[g]:off[g + 1]])) for g in range(len(sizes))]
        return IlpResult(x, r.total(x), "optimal", nv)
    left = None if time_limit is None else time_limit - (time.perf_counter() - start)
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    # HiGHS stops at a relative gap of 1e-4 by default: tightened, so "exact" means it
    opts = _options(left)
    opts["mip_rel_gap"] = 1e-9
    res = milp(cost, constraints=cons, integrality=integrality, bounds=Bounds(0, 1), options=opts)
    if res.x is None:
        return IlpResult(None, float("inf"), "infeasible" if res.status == 2 else f"no solution ({res.message})", nv)
    x = [int(np.argmax(res.x[off[g]:off[g + 1]])) for g in range(len(sizes))]
    return IlpResult(x, r.total(x), "optimal" if res.status == 0 else "time limit", nv)


def _options(time_limit: float | None, presolve: bool = True) -> dict:
    opts: dict = {"disp": False, "presolve": presolve}
    if time_limit is not None:
        opts["time_limit"] = max(0.1, float(time_limit))
    return opts
