"""Re-ranking the cheapest candidates by the execution simulator.

The analytic model adds costs up; ``sl.simulate`` runs the compiled step's actor plan (overlap of
communication with compute, pipeline schedules, registers), so it is the better judge among the few
best. Each is compiled with ``sl.compile`` exactly as a user would, simulated on its mesh's view of the
hardware, and the fastest within the memory limit wins. Without the simulator (or with
``rerank_top=0``) the analytic cheapest wins and the prediction says it is analytic.

The presets the analytic model likes best are simulated beside the searched finalists. The analytic
model sums costs, the runtime overlaps and buckets them, and deduction may derive backward layouts the
model did not assume; so a preset can be faster than every searched candidate in the simulator's eyes.
Then the preset wins, and a note says so: the search never hands back a strategy the simulator predicts
slower than a preset it simulated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..hardware import Hardware
from .candidate import Candidate
from .result import Predicted


def _simulator() -> Callable | None:
    try:
        from ..sim import simulate
    except ImportError:
        return None
    return simulate


def simulate_candidate(c: Candidate, model: torch.nn.Module, xs: tuple, loss_fn: Callable | None,
                       target: torch.Tensor | None, optimizer: Any, hw: Hardware) -> tuple[float, int]:
    """(step time, peak bytes on the fullest rank) of ``c`` compiled and simulated."""
    from ..compiler.api import compile as compile_step

    sim = _simulator()
    if sim is None:
        raise ImportError("sbplab.sim is not available")
    view = c.mesh.hardware(hw)
    step = compile_step(model, xs, loss_fn=loss_fn, target=target, optimizer=optimizer, strategy=c.strategy,
                        hardware=view)
    pred = sim(step, view)
    return float(pred.step_time), int(max(pred.peak_memory.values(), default=0))


def rerank(ranked: list[Candidate], top: int, model: torch.nn.Module, xs: tuple, loss_fn: Callable | None,
           target: torch.Tensor | None, optimizer: Any, hw: Hardware, memory_limit: float | None,
           notes: list[str], on_each: Callable[[Candidate], None] | None = None,
           presets: list[Candidate] = (), units: int = 0) -> tuple[Candidate, Predicted]:
    """The winner among ``ranked`` (cheapest first) and the ``top`` analytically cheapest of ``presets``,
    and its prediction. ``on_each(c)`` after each candidate is simulated (or fails to be), for a
    progress bar, and then once more for each of the ``units`` planned that had no candidate to fill it
    (fewer candidates or presets than ``top``), so the bar ends where it was planned to."""
    first = ranked[0]
    analytic = Predicted(first.step_time, first.memory, "analytic", first.step_time, first.memory)
    if top <= 0 or _simulator() is None:
        if top > 0:
            notes.append("sl.simulate is not available: ranked by the analytic cost model only")
        _fill(on_each, units)
        return first, analytic
    simulated = []
    rivals = sorted((p for p in presets if p.feasible(memory_limit) and p.step_time < float("inf")),
                    key=lambda p: p.step_time)[:top]
    pool = ranked[:top] + rivals
    for c in pool:
        try:
            c.simulated_time, c.simulated_memory = simulate_candidate(c, model, xs, loss_fn, target, optimizer, hw)
        except Exception as e:  # a candidate the compiler or simulator rejects is reported, not fatal
            notes.append(f"{c.describe()} could not be simulated: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        finally:
            if on_each is not None:
                on_each(c)
        if memory_limit is None or c.simulated_memory <= memory_limit:
            simulated.append(c)
    _fill(on_each, units - len(pool))
    if not simulated:
        return first, analytic
    best = min(simulated, key=lambda c: (c.simulated_time, c.method == "preset"))  # a tie: the searched one
    if best.method == "preset":
        notes.append(f"no searched candidate was predicted faster than the preset {best.label!r} by sl.simulate "
                     f"({best.simulated_time * 1e3:.4g} ms/step), so the search returns that preset")
    return best, Predicted(best.simulated_time, best.simulated_memory, "simulator", best.step_time, best.memory)


def _fill(on_each: Callable[[Candidate], None] | None, n: int) -> None:
    for _ in range(n if on_each is not None else 0):
        on_each(None)  # type: ignore[arg-type,misc]
