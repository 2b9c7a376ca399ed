"""Reading times off simulated firings: step ends, per-rank time breakdown, critical path.

The steady-state window is from the end of step 0 to the end of the last step: the first step
pays for filling registers and pipelines that later steps overlap, so differencing step ends gives
the time a step costs in a long run.
"""

from __future__ import annotations

from .engine import COMM, COMPUTE, Firings


def step_ends(f: Firings, step_of: list[list[int]], steps: int) -> list[float]:
    """Per step: when its last firing (on any rank) ended, in seconds."""
    ends = [0.0] * steps
    for j in range(len(f)):
        s = step_of[f.rank[j]][f.node[j]]
        s = f.k[j] // s if s > 0 else f.k[j]  # step_of holds M for micro actors, 0 for step actors
        if s < steps and f.end[j] > ends[s]:
            ends[s] = f.end[j]
    return ends


def window(ends: list[float]) -> tuple[float, float, int]:
    """(start, end, steps inside) of the steady-state window."""
    if len(ends) >= 2:
        return ends[0], ends[-1], len(ends) - 1
    return 0.0, ends[0] if ends else 0.0, 1


def _clip(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def rank_breakdown(f: Firings, ranks: list[int], lo: float, hi: float, n_steps: int) -> dict[int, dict[str, float]]:
    """Per rank, seconds per step: compute lane busy, communication not hidden behind compute, idle."""
    comp: dict[int, list[tuple[float, float]]] = {r: [] for r in ranks}
    comm: dict[int, list[tuple[float, float]]] = {r: [] for r in ranks}
    for j in range(len(f)):
        a, b = (f.start[j], f.end[j]) if f.lane[j] == COMPUTE else (f.xfer[j], f.end[j])
        if b <= lo or a >= hi:
            continue
        (comp if f.lane[j] == COMPUTE else comm)[f.rank[j]].append((max(a, lo), min(b, hi)))
    span = hi - lo
    out: dict[int, dict[str, float]] = {}
    for r in ranks:
        busy = sum(b - a for a, b in comp[r])
        merged: list[list[float]] = []
        for a, b in sorted(comm[r]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        hidden = 0.0
        cs = sorted(comp[r])
        ci = 0
        for a, b in merged:  # both sorted: sweep compute intervals once
            while ci < len(cs) and cs[ci][1] <= a:
                ci += 1
            cj = ci
            while cj < len(cs) and cs[cj][0] < b:
                hidden += _clip(cs[cj][0], cs[cj][1], a, b)
                cj += 1
        exposed = sum(b - a for a, b in merged) - hidden
        n = max(n_steps, 1)
        out[r] = {"compute": busy / n, "exposed communication": exposed / n,
                  "idle": max(0.0, span - busy - exposed) / n}
    return out


def critical_chain(f: Firings, lo: float) -> list[int]:
    """Firing ids from the last one back along ``cause`` while they end after ``lo``; oldest first."""
    if not len(f):
        return []
    j = max(range(len(f)), key=lambda i: f.end[i])
    chain = []
    while j >= 0 and f.end[j] > lo:
        chain.append(j)
        j = f.cause[j]
    return chain[::-1]


__all__ = ["COMM", "COMPUTE", "critical_chain", "rank_breakdown", "step_ends", "window"]
