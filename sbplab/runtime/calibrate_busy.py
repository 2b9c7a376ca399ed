"""Links measured while every core computes: each fit's ``busy_alpha``.

Why: ranks that fill a machine's cores (4 CPU ranks on 2 cores, or 2 on 2 while they compute) make
every transfer wait for the scheduler. Each round of a collective needs the backend's threads to
run, and a thread woken while the cores compute may wait for the kernel's next scheduler tick
(milliseconds) before it gets one. The quiet sweep (``calibrate_comm``) cannot see this: its ranks
do nothing but transfer. On a 2-core box a 4-rank all-reduce of 1 KiB then takes several times
its quiet time, whatever the bytes; that is what decides whether data parallel or a pipeline beats
running replicated there.

How: the quiet sweep's own plans, the two smallest sizes, with a chain of spinning kernels
(``close_step``) beside the transfers. For collectives every rank spins; the scheduler sees a
finished collective between two kernels, as in a training step. A sample counts only when its
transfer ended before its rank's spinning did; a kind the backend cannot poll (Gloo's
reduce-scatter) is seen finished only when the spinning ends, so it gets no busy figure. For point
to point, every pair of ranks ping-pongs at once and each reply comes between two compute bursts,
as pipeline stages do (``p2p_plan``); the first burst is taken off the round trip. busy_alpha is
the mean over steps and sizes of ``(seconds - bytes / bandwidth) / rounds``, never below the quiet
alpha.
Measured only where the computing ranks fill the cores (n >= cores for collectives, n / 2 >= cores
for point to point); elsewhere it stays None and transfers cost their quiet time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from ..boxing.kinds import kind_of
from ..hardware import CommFit
from .calibrate_comm import ITEM, collective_plan, comm_axes, message_seconds, p2p_plan, sent_bytes
from .calibration_common import SPIN_US, WARMUP_STEPS, run_measurement, spin_ends
from .trace import Trace

BURST_US = 500.0  # a pipeline stage's compute between its receive and its send, in the point-to-point game
GAMES = 4  # ping-pongs of each size per step
BUSY_SIZES = 2  # the sweep's smallest sizes: alpha is what the wait adds to, the bytes cost the same
COVER = 30.0  # spin for this many times the quiet transfers' time (busy ones are many times slower)
MIN_SPINS, MAX_SPINS = 100, 3000


def _spins(fit: CommFit, sizes: tuple[int, ...], per_size: int) -> int:
    quiet = sum(fit.alpha * per_size + s / fit.bandwidth for s in sizes)
    return max(MIN_SPINS, min(MAX_SPINS, math.ceil(COVER * quiet / (SPIN_US * 1e-6))))


def _busy_seconds(trace: Trace, actor: str, ranks: set[int], spun: dict[tuple[int, int], float]) -> list[float]:
    """Per steady step, the fastest member's time of ``actor``, when it ended while its rank spun."""
    best: dict[int, float] = {}
    for e in trace.events:
        if (e.actor == actor and e.rank in ranks and e.step >= WARMUP_STEPS
                and e.end <= spun.get((e.rank, e.step), -1.0)):
            best[e.step] = min(best.get(e.step, math.inf), e.dur / 1e6)
    return [best[s] for s in sorted(best)]


def _busy_alpha(fit: CommFit, rounds: int, points: list[tuple[int, list[float]]]) -> float | None:
    """The mean per-round time of the busy samples ((bytes, seconds per step) per size), or None. The
    mean, not the median: a wait for a core is either nothing or up to a scheduler tick, and a step
    pays what it costs on average."""
    per_round = [(t - b / fit.bandwidth) / rounds for b, ts in points for t in ts]
    return max(fit.alpha, statistics.fmean(per_round)) if per_round else None


def measure_busy(cluster, fits: list[CommFit], sizes: tuple[int, ...], repeats: int,
                 cores: int) -> list[CommFit]:
    """``fits`` with ``busy_alpha`` measured where the cluster's ranks can fill ``cores``."""
    n, small = cluster.n, sizes[:BUSY_SIZES]
    by_key = {(f.kind, f.axis, f.group_size): f for f in fits}
    out = dict(by_key)
    if n >= cores:
        for setting in comm_axes(n):
            for kind in sorted({f.kind for f in fits if f.axis is not None}):
                fit = by_key.get((kind, setting.axis, setting.group_size))
                if fit is None:
                    continue
                rounds = kind_of(kind).rounds(setting.group_size)
                plan = collective_plan(kind, setting, small, n, cluster.device_type, _spins(fit, small, rounds))
                trace = run_measurement(cluster, plan, repeats, timeout=120.0)
                spun = spin_ends(trace)
                members = {r for g in setting.groups for r in g}
                points = [(sent_bytes(trace, f"c{i}"), _busy_seconds(trace, f"c{i}", members, spun))
                          for i in range(len(small))]
                out[fit.kind, fit.axis, fit.group_size] = replace(fit, busy_alpha=_busy_alpha(fit, rounds, points))
    p2p = by_key.get(("send_recv", None, 2))
    if p2p is not None and n // 2 >= cores:
        games = small * GAMES  # the pairs fall into step with each other after the first few games
        trace = run_measurement(cluster, p2p_plan(games, n, cluster.device_type, BURST_US), repeats, timeout=120.0)
        points = [(max(1, size // ITEM) * ITEM, list(message_seconds(trace, i).values()))
                  for i, size in enumerate(games)]
        out["send_recv", None, 2] = replace(p2p, busy_alpha=_busy_alpha(p2p, 1, points))
    return list(out.values())
