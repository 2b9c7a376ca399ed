"""Pieces every calibration plan shares: a step that runs its measurements one after another, and
reading steady-state firing times off a run's trace.

Measurements must not overlap: two collectives in flight share the link, and step s + 1's first
transfer must not start while step s's last one runs. So each measured actor waits for the previous
one through a ``gate`` (an empty kernel reading the next value and the previous result), and the
step closes a loop through a State: ``tick`` (step s) -> gate -> measured -> gate -> ... -> ``tock``,
and ``tick`` of step s + 1 takes ``tock`` of step s as its update. Every actor is step-scope, so one
step is one pass over the sweep; step 0 warms up (first-touch allocation, Gloo's buffers) and is left
out of every figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import torch

from .actor_plan import ActorPlan
from .specs import Compute, Ref, State
from .trace import Trace

NOOP = "sbplab.runtime.kernels:noop"
SPIN = "sbplab.runtime.kernels:spin"
SPIN_US = 100.0  # one spinning kernel: short, so the scheduler looks at finished transfers between two
WARMUP_STEPS = 1


def tick() -> State:
    """The State that starts each step once the previous step's ``tock`` has fired."""
    return State("tick", init=torch.zeros(1), update=Ref("tock"))


def gate(name: str, value: str | Ref, after: str | Ref) -> Compute:
    """Passes ``value`` on once ``after`` has fired (an empty kernel: its output is its first input)."""
    return Compute(name, op=NOOP, inputs=(value, after), scope="step", registers=1)


def tock(after: str | Ref) -> Compute:
    """Closes the step: the next ``tick`` fires only when ``after`` (the last measurement) is done."""
    return Compute("tock", op=NOOP, inputs=("tick", after), scope="step", registers=1)


def close_step(acts: list, after: str, spins: int = 0) -> list:
    """``acts`` then ``tock``; with ``spins``, a chain of that many spinning kernels (``SPIN_US`` each)
    runs beside them from ``tick`` on, and the step closes when both are done: the rank computes
    all through its measurements, as in a training step."""
    if spins:
        chain = [Compute(f"spin{j}", op=SPIN, inputs=("tick" if j == 0 else f"spin{j - 1}",),
                         attrs={"us": SPIN_US}, scope="step", registers=1) for j in range(spins)]
        acts = acts + chain + [gate("spun", after, f"spin{spins - 1}")]
        after = "spun"
    return acts + [tock(after)]


def spin_ends(trace: Trace) -> dict[tuple[int, int], float]:
    """(rank, step) -> when that rank's last spinning kernel of the step ended (us)."""
    out: dict[tuple[int, int], float] = {}
    for e in trace.events:
        if e.actor.startswith("spin"):
            key = (e.rank, e.step)
            out[key] = max(out.get(key, 0.0), e.end)
    return out


def run_measurement(cluster, plan: ActorPlan, repeats: int, *, timeout: float = 60.0) -> Trace:
    """Run ``plan`` for the warm-up step plus ``repeats`` steps and return its trace. Unfused
    (``fuse=False``): a measurement times every actor on its own, and the scheduler must see a transfer
    end between two spinning kernels, not only after a chain of them (``fusion.py``)."""
    res = cluster.run(plan, None, steps=WARMUP_STEPS + repeats, progress=False, params=False, timeout=timeout,
                      fuse=False)
    return res.trace


def firing_seconds(trace: Trace, actor: str, ranks: Iterable[int]) -> list[float]:
    """Per steady step, the seconds ``actor`` took on the fastest of ``ranks``.

    For a collective the fastest member is the one that arrived last: its time is the transfer, not
    the wait for the others. For a one-rank measurement it is that rank's time.
    """
    ranks = set(ranks)
    best: dict[int, float] = {}
    for e in trace.events:
        if e.actor == actor and e.rank in ranks and e.step >= WARMUP_STEPS:
            best[e.step] = min(best.get(e.step, float("inf")), e.dur / 1e6)
    return [best[s] for s in sorted(best)]


def median(xs: list[float], what: str) -> float:
    if not xs:
        raise RuntimeError(f"calibration: no steady-state firings of {what} in the trace")
    return float(statistics.median(xs))
