"""A long run as consecutive runs of a few steps each (``run(..., checkpoint_every=N)``).

Runs of a compiled step continue exactly (``carry.py``): the second of two runs of N steps starts from
the bit-exact final state of the first, so cutting a run into chunks changes no number. What it buys:
after each chunk the driver holds that step's state (and, with ``checkpoint_dir``, the workers write
it to disk), so a failure loses at most the steps of the chunk it hit. Here: each chunk's batches,
and the chunks' results put back together as if one run had made them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..errors import InputError
from .results import Batches, RunResult
from .trace import Trace


def check_every(every: Any, folder: Any, carry: bool, steps: Any) -> int | None:
    """``run``'s checkpoint_every, checked: None or an int >= 1, for a compiled step only."""
    if every is None and folder is None:
        return None
    if not carry:
        raise InputError("run: checkpoint_every and checkpoint_dir need a compiled step (sl.compile(...)); an "
                         "ActorPlan given directly starts from its States' init every run, so it keeps no state")
    if every is None:
        return None
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise InputError(f"run: checkpoint_every must be an int >= 1 (keep the state every that many steps) or "
                         f"None, got {every!r}")
    return every if isinstance(steps, int) and every < steps else None


def chunk_batches(batches: Batches | None, start: int, n: int) -> Batches | None:
    """The batches of steps ``start .. start + n - 1``, numbered from 0 as a run of ``n`` steps reads them."""
    if batches is None or isinstance(batches, Mapping):
        return batches  # one batch for every step
    if callable(batches):
        fn: Callable[[int], Mapping] = batches
        return lambda s: fn(s + start)
    return list(batches[start:start + n])


def merge_results(parts: list[RunResult], micro_batches: int) -> RunResult:
    """One result for consecutive chunks: losses and outputs in order, the last chunk's parameters and
    final shards, and one trace where chunk i's events come after chunk i - 1's (each chunk's clock
    starts at its own first firing; the chunks are laid end to end by their wall time) with their steps
    and firings numbered across the whole run."""
    out = RunResult(steps=sum(p.steps for p in parts), wall_s=sum(p.wall_s for p in parts))
    out.params, out.final_shards = parts[-1].params, parts[-1].final_shards
    for p in parts:  # each rank's peak over the chunks
        out.memory.update({r: m for r, m in p.memory.items() if r not in out.memory or m.peak > out.memory[r].peak})
    trace = Trace(offsets_us=dict(parts[0].trace.offsets_us))
    step0, t0 = 0, 0.0
    for p in parts:
        out.losses += p.losses
        for key, values in p.outputs.items():
            out.outputs.setdefault(key, []).extend(values)
        base = len(trace.events)
        for e in p.trace.events:
            per = micro_batches if e.micro >= 0 else 1
            trace.events.append(replace(e, step=e.step + step0, firing=e.firing + step0 * per,
                                        start=e.start + t0, end=e.end + t0))
        trace.flows += [(a + base, b + base) for a, b in p.trace.flows]
        step0 += p.steps
        t0 += p.wall_s * 1e6
    out.trace = trace
    return out
