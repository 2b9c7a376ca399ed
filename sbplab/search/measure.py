"""Measuring the finalists on real workers: the last word where the simulator's figures fall short.

The simulator predicts from calibrated figures. On a machine whose ranks fill or outnumber its cores
(4 CPU ranks on 2 cores) the step time also depends on scheduling waits of up to a scheduler tick,
which come and go with what runs beside a transfer; a calibration captures their average, not
which strategy they hit hardest. So, as Alpa profiles its stage candidates on the real devices,
``sl.search(..., measure_on=cluster)`` runs the finalists the re-rank simulated (the searched ones
and every applicable preset) on ``cluster`` and keeps the fastest measured one: measured that way,
the result is never slower than a preset, up to the machine's noise between two timings.

Each finalist runs as a user would time it: the wall time of ``cluster.run`` with 1 + n steps minus
that of 1 step, over n. A first short round (3 steps each, not counted) sizes n so that each run
takes about ``SECONDS``. The finalists take turns, round after round (a slow moment of the machine
then hits them all), and each keeps the median of its rounds. A preset that measures fastest wins,
with a note, as in the simulated re-rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .candidate import Candidate

ROUNDS = 3
SECONDS = 0.2  # wall time of one timed run
MAX_STEPS = 100


def _steps_for(per_step: float) -> int:
    return max(3, min(MAX_STEPS, int(SECONDS / max(per_step, 1e-4))))


def wall_per_step(cluster: Any, step: Any, batch: tuple, n: int) -> float:
    """Seconds per step a user waits for: (wall time of 1 + n steps - wall time of 1 step) / n.

    Both runs start from the compiled weights (``restart``): a run that continued would ship no state
    while the run before it, after another finalist's, ships its spare copy, and the difference of the
    two would then measure that copy instead of the steps."""
    t0 = time.perf_counter()
    cluster.run(step, batch, steps=1, progress=False, params=False, trace=False, restart=True)
    t1 = time.perf_counter()
    cluster.run(step, batch, steps=1 + n, progress=False, params=False, trace=False, restart=True)
    t2 = time.perf_counter()
    return max(0.0, (t2 - t1) - (t1 - t0)) / n


def measure_finalists(finalists: list[Candidate], steps: dict[int, Any], cluster: Any, batch: tuple,
                      notes: list[str], rounds: int = ROUNDS,
                      tick: Callable[[], None] = lambda: None) -> Candidate:
    """Run every finalist (``steps``: its compiled step by ``id``) on ``cluster``; set each one's
    ``measured_time`` and return the fastest (a tie goes to a searched one; if none can run, the one
    the simulator preferred). ``tick()`` after each finalist's turn in a round."""
    runs = {id(c): 3 for c in finalists}  # a first, short round sizes the runs by what each really takes
    times: dict[int, list[float]] = {id(c): [] for c in finalists}
    failed: set[int] = set()
    for r in range(rounds + 1):
        for c in finalists:
            if id(c) not in failed:
                try:
                    t = wall_per_step(cluster, steps[id(c)], batch, runs[id(c)])
                    if r == 0:
                        runs[id(c)] = _steps_for(t)
                    else:
                        times[id(c)].append(t)
                except Exception as e:  # noqa: BLE001 - one finalist that cannot run is reported, not fatal
                    failed.add(id(c))
                    notes.append(f"{c.describe()} could not be measured on the cluster: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}")
            tick()
    ran = [c for c in finalists if id(c) not in failed]
    by_sim = min(finalists, key=lambda c: (c.simulated_time, c.method == "preset"))
    if not ran:
        return by_sim
    for c in ran:
        c.measured_time = statistics.median(times[id(c)])
    best = min(ran, key=lambda c: (c.measured_time, c.method == "preset"))
    if best is not by_sim and by_sim.measured_time is not None:
        notes.append(f"measured on the cluster, {best.describe()} ran fastest ({best.measured_time * 1e3:.4g} "
                     f"ms/step); sl.simulate preferred {by_sim.describe()}, which measured "
                     f"{by_sim.measured_time * 1e3:.4g} ms/step")
    return best
