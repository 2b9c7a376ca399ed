"""Re-ranking the cheapest candidates by the execution simulator.

The analytic model adds costs up; ``sl.simulate`` runs the compiled step's actor plan (overlap of
communication with compute, pipeline schedules, registers), so it is the better judge among the few
best. Each is compiled with ``sl.compile`` exactly as a user would, simulated on its mesh's view of the
hardware, and the fastest within the memory limit wins. Without the simulator (or with
``rerank_top=0``) the analytic cheapest wins and the prediction says it is analytic.

Every preset within the memory limit is simulated beside the searched finalists, and so is every
strategy the user gave (``sl.search(..., candidates=[...])``). The analytic model sums costs, the runtime
overlaps and buckets them, and deduction may derive backward layouts the model did not assume; so a
preset the analytic model ranks low can still be the fastest in the simulator's eyes. Then the preset
wins, and a note says so: the search never hands back a strategy the simulator predicts slower than a
preset or user candidate it simulated. Given a cluster (``sl.search(measure_on=...)``), the simulated
finalists all run on it, and the fastest measured wins (``measure.py``). The search's ``time_budget``
bounds all of this: what is left when it runs out is not simulated, and a note says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..hardware import Hardware
from .candidate import Candidate
from .clock import Clock
from .measure import ROUNDS as MEASURE_ROUNDS
from .measure import measure_finalists
from .result import Predicted
from .sim_floor import Floors
from .user_candidates import USER_METHOD

BUCKET_MB_CHOICES = (0.0, 1.0, 4.0, 25.0, 100.0)  # MiB; 0: every gradient reduced on its own


def _simulator() -> Callable | None:
    try:
        from ..sim import simulate
    except ImportError:
        return None
    return simulate


def simulate(step: Any, hw: Hardware) -> Any:
    sim = _simulator()
    if sim is None:
        raise ImportError("sbplab.sim is not available")
    return sim(step, hw)


def simulate_candidate(c: Candidate, model: torch.nn.Module, inputs: Any, loss_fn: Callable | None,
                       target: Any, optimizer: Any, hw: Hardware) -> tuple[float, int]:
    """(step time, peak bytes on the fullest rank) of ``c`` compiled and simulated."""
    t, mem, _ = _compile_and_simulate(c, model, inputs, loss_fn, target, optimizer, hw)
    return t, mem


def _compile_and_simulate(c: Candidate, model: torch.nn.Module, inputs: Any, loss_fn: Callable | None,
                          target: Any, optimizer: Any, hw: Hardware, graphs: Callable[[int], Any] | None = None,
                          floors: Floors | None = None) -> tuple[float, int, Any] | None:
    """``graphs(m)``: the training graph of m micro-batches, as ``sl.compile`` would trace it (the search's
    own): a copy is compiled instead of tracing the model again (an ATen capture takes seconds).
    ``floors``: None (not simulated) when the deduction's floor says ``c`` cannot win (``Floors``), before
    the expansion, lowering and simulation that take most of a finalist's seconds."""
    from ..compiler.api import compile as compile_step
    from ..compiler.api import deduce_training_graph, expand_deduced

    view = c.mesh.hardware(hw)
    if graphs is not None:
        g, d, report = deduce_training_graph(graphs(c.strategy.micro_batches).copy(), c.strategy, view)
        if floors is not None and floors.cannot_win_deduced(c, d, view):
            return None
        step = expand_deduced(c.strategy, g, d, report)
    else:
        step = compile_step(model, inputs, loss_fn=loss_fn, target=target, optimizer=optimizer, strategy=c.strategy,
                            hardware=view)
    pred = simulate(step, view)
    return float(pred.step_time), int(max(pred.peak_memory.values(), default=0)), step


def tune_buckets(c: Candidate, step: Any, hw: Hardware, notes: list[str], memory_limit: float | None = None,
                 tick: Callable[[], None] = lambda: None, sizes: tuple[float, ...] = BUCKET_MB_CHOICES,
                 clock: Clock | None = None) -> None:
    """Give ``c`` the gradient bucket size (``Strategy.bucket_mb``) the simulator predicts fastest.

    Buckets trade latency (one collective for many gradients) against overlap (a small bucket goes out
    while backward still runs; the last one never overlaps anything), so the best size depends on the
    strategy and the machine. Only lowering changes, so each size re-lowers ``step`` (the compiled
    ``c``) and simulates it; a size wins only by being strictly faster than the one ``c`` has.
    ``tick()`` after each size tried (or skipped: once ``clock`` has run out, no size is tried).
    """
    view = c.mesh.hardware(hw)
    have = step.strategy.bucket_mb
    best = (c.simulated_time, have, c.simulated_memory)
    for mb in sizes:
        if mb == have:
            continue
        if clock is not None and clock.expired():
            tick()
            continue
        pred = simulate(replace(step, strategy=replace(step.strategy, bucket_mb=mb)), view)
        peak = int(max(pred.peak_memory.values(), default=0))
        if pred.step_time < best[0] * (1 - 1e-9) and (memory_limit is None or peak <= memory_limit):
            best = (float(pred.step_time), mb, peak)
        tick()
    if best[1] != have:
        notes.append(f"gradient buckets of {best[1]:g} MiB instead of {have:g}: sl.simulate predicts "
                     f"{best[0] * 1e3:.4g} ms/step instead of {c.simulated_time * 1e3:.4g}")
        c.simulated_time, c.bucket_mb, c.simulated_memory = best


def rerank_units(top: int, presets: int, tune: bool = True, measure: bool = False, users: int = 0) -> int:
    """Units of progress ``rerank`` reports: each finalist, preset and user candidate simulated (and,
    measuring, each one's turn in every round), each bucket size tried."""
    finalists = top + presets + users if top > 0 else 0
    per_finalist = 1 + (MEASURE_ROUNDS + 1 if measure else 0)  # simulated; measured: sizing round + rounds
    buckets = len(BUCKET_MB_CHOICES) - 1 if tune and top > 0 else 0
    return finalists * per_finalist + buckets


def _order(c: Candidate) -> int:
    """A tie in time goes to a searched candidate, then to the user's, then to a preset."""
    return {USER_METHOD: 1, "preset": 2}.get(c.method, 0)


def rerank(ranked: list[Candidate], top: int, model: torch.nn.Module, inputs: Any, loss_fn: Callable | None,
           target: Any, optimizer: Any, hw: Hardware, memory_limit: float | None,
           notes: list[str], on_each: Callable[[Candidate | None], None] | None = None,
           presets: list[Candidate] = (), tune: bool = True, units: int | None = None,
           measure: tuple[Any, tuple] | None = None,
           graphs: Callable[[int], Any] | None = None, clock: Clock | None = None,
           users: list[Candidate] = ()) -> tuple[Candidate, Predicted]:
    """The winner among ``ranked`` (cheapest first, the ``top`` cheapest simulated), every preset within
    the memory limit and every user candidate (``users``), and its prediction; with ``tune``, then the
    winner's gradient bucket size (``tune_buckets``). Every preset is simulated, not only those the
    analytic model likes: it can be off by 2x, and the best preset a table names must be the simulator's.
    ``measure``: (cluster, batch): the simulated finalists also run on the cluster, and the fastest
    measured wins (``measure.py``).
    ``clock``: the search's time budget bounds the re-rank too: once it has run out nothing more is
    simulated, tuned or measured (a note says what was left), and the winner is the best of what was.
    ``on_each`` is called once per unit of progress, ``units`` times in all (default ``rerank_units``),
    a unit without work too, so a progress bar ends where it was planned to.
    ``graphs``: the training graph per micro-batch count (``Space.graph``), compiled instead of tracing
    the model once per finalist; not when measuring (the runs need the model's real values)."""
    ticks = [0]

    def tick(c: Candidate | None = None) -> None:
        ticks[0] += 1
        if on_each is not None:
            on_each(c)

    try:
        return _rerank(ranked, top, model, inputs, loss_fn, target, optimizer, hw, memory_limit, notes, tick, presets,
                       tune, measure, graphs if measure is None else None, clock, list(users))
    finally:
        for _ in range((rerank_units(top, len(presets), tune, measure is not None, len(users)) if units is None
                        else units) - ticks[0]):
            tick()


def _rerank(ranked: list[Candidate], top: int, model: torch.nn.Module, inputs: Any, loss_fn: Callable | None,
            target: Any, optimizer: Any, hw: Hardware, memory_limit: float | None,
            notes: list[str], tick: Callable[..., None], presets: list[Candidate],
            tune: bool, measure: tuple[Any, tuple] | None,
            graphs: Callable[[int], Any] | None = None, clock: Clock | None = None,
            users: list[Candidate] = ()) -> tuple[Candidate, Predicted]:
    first = min([*ranked[:1], *(u for u in users if u.feasible(memory_limit))], key=lambda c: (c.step_time, _order(c)))
    analytic = Predicted(first.step_time, first.memory, "analytic", first.step_time, first.memory)
    if top <= 0 or _simulator() is None:
        if top > 0:
            notes.append("sl.simulate is not available: ranked by the analytic cost model only")
        return first, analytic
    simulated = []
    rivals = [p for p in presets if p.feasible(memory_limit) and p.step_time < float("inf")]
    # the user's first (they asked), then cheapest first, so a budget that runs out cuts the least likely
    queue = users + sorted(ranked[:top] + rivals, key=lambda c: c.step_time)
    steps: dict[int, Any] = {}
    left: list[Candidate] = []
    floors = Floors(hw, measure is None)
    for c in queue:
        if clock is not None and clock.expired():
            left.append(c)
            tick(c)
            continue
        if c.method != USER_METHOD and floors.cannot_win(c):
            tick(c)
            continue
        try:
            got = _compile_and_simulate(c, model, inputs, loss_fn, target, optimizer, hw, graphs,
                                        floors if c.method != USER_METHOD else None)
            if got is None:  # its deduction's floor: it cannot win
                continue
            c.simulated_time, c.simulated_memory, steps[id(c)] = got
        except Exception as e:  # a candidate the compiler or simulator rejects is reported, not fatal
            notes.append(f"{c.describe()} could not be simulated: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        finally:
            tick(c)
        within = memory_limit is None or c.simulated_memory <= memory_limit
        floors.check(c, within)
        if within:
            simulated.append(c)
        if measure is None:  # only the winner's compiled step is used again (its bucket size): at 64 ranks
            lead = min(simulated, key=lambda c: (c.simulated_time, _order(c))) if simulated else None  # each
            for k in [k for k in steps if lead is None or k != id(lead)]:  # holds hundreds of MB
                del steps[k]
    floors.note(notes)
    if left:
        notes.append(f"the time budget ran out during the re-rank: {len(left)} of {len(queue)} finalists were not "
                     f"simulated ({', '.join(c.label for c in left[:4])}{', ...' if len(left) > 4 else ''}); the "
                     f"winner is the best of those simulated")
    if not simulated:
        return first, analytic
    by_sim = min(simulated, key=lambda c: (c.simulated_time, _order(c)))  # a tie: the searched one
    if measure is not None and clock is not None and clock.expired():
        notes.append("the time budget ran out before the finalists could be measured: the simulator chose")
        measure = None
    best = by_sim if measure is None else measure_finalists(simulated, steps, *measure, notes, MEASURE_ROUNDS, tick)
    if best.method in ("preset", USER_METHOD) and best is by_sim:  # a preset stays as its maker wrote it
        what = "the preset" if best.method == "preset" else "your candidate"
        notes.append(f"no searched candidate was predicted faster than {what} {best.label!r} by sl.simulate "
                     f"({best.simulated_time * 1e3:.4g} ms/step), so the search returns it")
    elif best.method not in ("preset", USER_METHOD) and tune:
        tune_buckets(best, steps[id(best)], hw, notes, memory_limit, tick, clock=clock)
    return best, Predicted(best.simulated_time, best.simulated_memory, "simulator", best.step_time, best.memory)
