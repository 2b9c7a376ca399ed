"""One rank's peak memory, predicted or measured, in the same four categories.

Why one type: the simulator predicts each rank's peak from its register lifetimes
(``sim/register_memory.py``) and the runtime measures it while a run fires the same registers
(``MemoryMeter``); ``sl.compare(pred, result)`` and the benchmarks put the two side by side, which only
means something if both speak of the same things. So the categories of a register are decided here,
once, from the plan's actors, for both:

``parameters`` (States read by forward or backward actors, and the next values an update computes for
them), ``optimizer state`` (States only the update reads, and their next values), ``gradients``
(Accumulate buffers, backward registers the update reads, the collectives and accumulations feeding
those, and the shared gradient-bucket buffers), ``activations`` (everything else: inputs, activations,
activation gradients, boxing buffers).

What "measured" means: on a GPU, ``torch.cuda.max_memory_allocated`` over the run (everything the
caching allocator handed out: kernel workspaces too, the excess shown as ``other``); on a CPU, the bytes
of the tensors the runtime holds: State values, shared buffers and every register from the firing that
fills it until its last reader acks it (what the runtime frees). A kernel's temporaries and the
intermediate values inside one fused chain are not held by the runtime, so they are not counted there.

Over time: the meter also keeps a sample ``(clock ns, bytes held)`` each time a firing stores or frees a
register (two appends to typed arrays, no allocation per firing), so a timeline draws each rank's
memory as a counter track under its lanes (``Trace.memory_series`` puts the samples on the trace's
clock). Those are the bytes the runtime holds, on a GPU too: the allocator's own total is read once, at
the end, for the peak.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .specs import Accumulate, Actor, Collective, State

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations")


@dataclass
class MemoryPeak:
    """Peak bytes of one rank and what they were at that moment (per category)."""

    peak: int
    breakdown: dict[str, int] = field(default_factory=dict)
    at_us: float = 0.0  # when (microseconds into the run; predicted: simulated time)
    source: str = "simulated"  # "simulated", "registers" (CPU: tensors the runtime holds) or "cuda" (allocator)
    # measured runs: (worker clock ns, bytes held) after each change, on the clock the trace's firings use
    samples: list[tuple[int, int]] = field(default_factory=list, repr=False)


def categories(actors: Sequence[Actor]) -> dict[tuple[str, int], str]:
    """(actor name, output index) -> the category of that register (a State: of its persistent value)."""
    by_name = {a.name: a for a in actors}
    readers: dict[str, list[Actor]] = {a.name: [] for a in actors}
    for a in actors:
        for ref in a.inputs:
            readers[ref.actor].append(a)
    cat: dict[tuple[str, int], str] = {}
    for a in actors:
        if isinstance(a, State):
            used = any(c.phase != "update" for c in readers[a.name])
            cat[(a.name, 0)] = "parameters" if used else "optimizer state"
    for a in actors:
        if isinstance(a, State) and a.update is not None:
            cat.setdefault((a.update.actor, a.update.index), cat[(a.name, 0)])
    grads = [a.name for a in actors if isinstance(a, Accumulate) or (
        a.phase == "backward" and any(c.phase == "update" or isinstance(c, Accumulate) for c in readers[a.name]))]
    seen: set[str] = set()
    while grads:  # the reductions feeding a gradient carry the gradient too
        name = grads.pop()
        if name in seen:
            continue
        seen.add(name)
        a = by_name[name]
        for j in range(max(a.num_outputs, 1)):
            cat.setdefault((name, j), "gradients")
        if isinstance(a, (Collective, Accumulate)):
            grads.extend(r.actor for r in a.inputs if by_name[r.actor].phase == "backward")
    for a in actors:
        for j in range(max(a.num_outputs, 1)):
            cat.setdefault((a.name, j), "activations")
    return cat


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class MemoryMeter:
    """Counts the bytes a rank's executor holds, by category, and keeps the peak.

    ``actors``: what the executor fires (fused or not), ``origin``: per fired actor the plan indices it
    runs, ``plan``: the rank plan's actors (the categories are theirs). ``stored(i, outs)`` when actor i's
    outputs enter a register, ``freed(i, outs)`` when the executor drops them."""

    def __init__(self, actors: Sequence[Actor], origin: Sequence[Sequence[int]], plan: Sequence[Actor],
                 behaviours: Sequence[Any], buffers: dict[str, list[torch.Tensor]], device: torch.device) -> None:
        cats = categories(plan)
        self.cats: list[list[str] | None] = []
        for a, parts in zip(actors, origin):
            exposed = getattr(a, "exposed", ())
            names = [plan[parts[p]].name if p >= 0 else a.name for p, _ in exposed] if exposed else None
            last = plan[parts[-1]].name
            if isinstance(a, State) or getattr(a, "into", None) is not None:
                self.cats.append(None)  # the State's own tensor, or a view of a shared buffer: counted once
            else:
                self.cats.append([cats.get((names[j], exposed[j][1]) if names else (last, j), "activations")
                                  for j in range(max(a.num_outputs, 1))])
        self.now = dict.fromkeys(CATEGORIES, 0)
        for a, b in zip(actors, behaviours):
            if isinstance(a, State):
                self.now[cats.get((a.name, 0), "parameters")] += _nbytes(getattr(b, "value", None))
        self.now["gradients"] += sum(_nbytes(t) for ts in buffers.values() for t in ts)
        self.total = sum(self.now.values())
        self.peak, self.best, self.at_ns = self.total, dict(self.now), time.perf_counter_ns()
        self.start_ns = self.at_ns
        self.t_ns, self.held = array("q", [self.at_ns]), array("q", [self.total])  # the memory over time
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        self.device = device

    def stored(self, i: int, outs: tuple) -> None:
        cats = self.cats[i]
        if cats is None:
            return
        now = self.now
        for t, c in zip(outs, cats):
            nb = _nbytes(t)
            now[c] += nb
            self.total += nb
        t = time.perf_counter_ns()
        self.t_ns.append(t)
        self.held.append(self.total)
        if self.total > self.peak:
            self.peak, self.best, self.at_ns = self.total, dict(now), t

    def freed(self, i: int, outs: tuple | None) -> None:
        cats = self.cats[i]
        if cats is None or outs is None:
            return
        for t, c in zip(outs, cats):
            nb = _nbytes(t)
            self.now[c] -= nb
            self.total -= nb
        self.t_ns.append(time.perf_counter_ns())
        self.held.append(self.total)

    def result(self) -> MemoryPeak:
        at = (self.at_ns - self.start_ns) / 1e3
        samples = list(zip(self.t_ns.tolist(), self.held.tolist()))
        if self.cuda:
            peak = int(torch.cuda.max_memory_allocated(self.device))
            other = max(0, peak - self.peak)
            return MemoryPeak(peak, {**self.best, "other": other}, at, "cuda", samples)
        return MemoryPeak(int(self.peak), dict(self.best), at, "registers", samples)
