"""``"exact"``: Alpa's integer linear program over one mesh, solved by HiGHS (``scipy.optimize.milp``).

Variables: ``x[g, c]`` in {0, 1}, one-hot per group (``sum_c x[g, c] = 1``); per edge (a, b) and pair
of choices (c, d) with a positive resharding cost, ``e[ab, cd]`` in [0, 1] with
``e >= x[a, c] + x[b, d] - 1`` (the product x[a, c] * x[b, d], linearised: minimising drives it to
exactly that product). Objective: node costs plus edge costs. Memory: ``sum memory[g, c] x[g, c] <=
limit``. Pairs of cost zero need no variable. The LP relaxation of that linearisation is weak, so
``tight=True`` (the default) also adds the marginal constraints ``sum_d e[ab, cd] = x[a, c]`` and
``sum_c e[ab, cd] = x[b, d]`` over every pair, which the same optimum satisfies and which make the
relaxation nearly integral on layer stacks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shrink import Reduced


@dataclass
class IlpResult:
    x: list[int] | None  # a choice per group, None when infeasible
    objective: float
    status: str  # "optimal", "time limit" (best found so far), "infeasible"
    variables: int


def solve_ilp(r: Reduced, memory_limit: float | None = None, time_limit: float | None = None,
              tight: bool = True) -> IlpResult:
    """The cheapest choice per group of ``r`` within ``memory_limit`` bytes per device."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # scipy loads when an ILP is solved
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
            ids = nv + np.arange(na * nb).reshape(na, nb)
            c.append(d.reshape(-1))
            nv += na * nb
            # sum_d e[c, d] - x[a, c] = 0 ; sum_c e[c, d] - x[b, d] = 0
            rr = np.concatenate([np.repeat(np.arange(na), nb), np.arange(na)])
            add(rr, np.concatenate([ids.reshape(-1), off[a] + np.arange(na)]),
                np.concatenate([np.ones(na * nb), -np.ones(na)]), [0.0] * na, [0.0] * na)
            rr = np.concatenate([np.tile(np.arange(nb), na), np.arange(nb)])
            add(rr, np.concatenate([ids.reshape(-1), off[b] + np.arange(nb)]),
                np.concatenate([np.ones(na * nb), -np.ones(nb)]), [0.0] * nb, [0.0] * nb)
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
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    # HiGHS stops at a relative gap of 1e-4 and an absolute one of 1e-6 by default: costs go in as
    # microseconds (so the absolute gap is negligible) and the relative gap is tightened, so "exact" means it
    opts = {"disp": False, "mip_rel_gap": 1e-9}
    if time_limit is not None:
        opts["time_limit"] = max(0.1, float(time_limit))
    res = milp(np.concatenate(c) * 1e6, constraints=LinearConstraint(A, lo, hi), integrality=integrality,
               bounds=Bounds(0, 1), options=opts)
    if res.x is None:
        return IlpResult(None, float("inf"), "infeasible" if res.status == 2 else f"no solution ({res.message})", nv)
    x = [int(np.argmax(res.x[off[g]:off[g + 1]])) for g in range(len(sizes))]
    return IlpResult(x, r.total(x), "optimal" if res.status == 0 else "time limit", nv)
