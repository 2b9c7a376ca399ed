"""``"cd"``: AutoDDL's coordinate descent. Sweep the groups; give each the choice that lowers the
step time most with every other choice fixed; repeat while a sweep still helps. Restarted from each
given start (the presets' own choices, the all-replicated one), the best end point wins."""

from __future__ import annotations

import numpy as np

from .clock import Clock
from .local_moves import LocalView
from .shrink import Reduced


def _first_best(opts: np.ndarray, ex: np.ndarray | None) -> int:
    """The first choice of least (memory excess, seconds), as ``min`` over (ex[c], opts[c]) picks it, on
    arrays: a sweep asks this of every group, and a group has dozens of choices."""
    if ex is None:
        return int(np.argmin(opts))
    idx = np.flatnonzero(ex == ex.min())
    return int(idx[np.argmin(opts[idx])])


def descend(r: Reduced, start: list[int], memory_limit: float | None, clock: Clock,
            max_sweeps: int = 50, seen: dict[tuple[int, ...], tuple[list[int], int]] | None = None) -> list[int]:
    """``start`` improved sweep by sweep until a sweep changes nothing (or ``max_sweeps``).

    ``seen``: the choices each earlier descent on ``r`` had at the start of a sweep, with where it ended and
    how many sweeps that took. A sweep is a function of the choices alone, so a descent that meets such a
    point ends where that one did (when it has the sweeps left): restarts from many starts mostly meet."""
    view = LocalView(r, memory_limit)
    x = list(start)
    mem = r.mem(x)
    path: list[tuple[int, ...]] = []
    for sweep in range(max_sweeps):
        if seen is not None:
            key = tuple(x)
            got = seen.get(key)
            if got is not None and sweep + got[1] <= max_sweeps and not clock.expired():
                _remember(seen, [*path, key], got[0], got[1])
                return list(got[0])
            path.append(key)
        improved = False
        for g in range(len(r.cost)):
            if clock.expired():
                return x
            opts = view.options(x, g)
            cur = x[g]
            mems = mem - r.memory[g][cur] + r.memory[g]  # int64 bytes per choice
            ex = None if memory_limit is None else np.maximum(0.0, mems - memory_limit)
            best = _first_best(opts, ex)
            e_best, e_cur = (0.0, 0.0) if ex is None else (float(ex[best]), float(ex[cur]))
            if (e_best, float(opts[best])) < (e_cur, float(opts[cur]) - 1e-15):
                x[g] = best
                mem = int(mems[best])
                improved = True
        if not improved:
            if seen is not None:
                _remember(seen, path, x, 1)
            break
    return x


def _remember(seen: dict[tuple[int, ...], tuple[list[int], int]], path: list[tuple[int, ...]], end: list[int],
              last: int) -> None:
    """Each sweep start of ``path`` ends at ``end``: after its sweeps to the path's last point, which takes
    ``last`` more."""
    for k, key in enumerate(path):
        seen.setdefault(key, (list(end), len(path) - k - 1 + last))


def coordinate_descent(r: Reduced, starts: list[list[int]], memory_limit: float | None, clock: Clock,
                       label: str = "cd") -> list[int]:
    view = LocalView(r, memory_limit)
    best, best_score = None, None
    seen: dict[tuple[int, ...], tuple[list[int], int]] = {}  # shared by the restarts (``descend``)
    for s in starts:
        x = descend(r, s, memory_limit, clock, seen=seen)
        sc = view.score(x)
        clock.record(label, sc[1] if sc[0] == 0 else float("inf"))
        if best_score is None or sc < best_score:
            best, best_score = x, sc
        if clock.expired():
            break
    return best if best is not None else list(starts[0])
