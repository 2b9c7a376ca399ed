"""The one memory model of a training step: each rank's peak from the lifetimes of its actor registers.

Why one model: a step's memory used to have several figures (the compile summary walked the physical
graph in order, the simulator followed register lifetimes, the search summed per-op estimates), and
they disagreed by up to 2.5x. The register lifetimes are what the runtime really holds (a register
lives from the firing that fills it until its last reader acks it), and the runtime measures the same
thing (``RunResult.memory``), so that is the model every output uses:

- ``step_memory(step, hardware)``: per rank, the peak and its categories (parameters, gradients,
  optimizer state, activations: ``runtime.memory_peak.CATEGORIES``), from a simulated run of the step;
- ``Compiled.memory`` / ``step.summary()`` show it (``compiler/physical/memory.py`` is a view of it);
- ``sl.simulate`` gives the same figure (``Prediction.memory``) and warns (``MemoryCapacityWarning``)
  when a rank's peak exceeds the device memory the machine model gives.

Lifetimes follow message timing, so the figure belongs to a machine: without one, the reference is
the one the boxing planner prices on (``Hardware.cpu_box()`` for CPU and device-free steps,
``Hardware.h100_node()`` for CUDA ones).
"""

from __future__ import annotations

import warnings
from typing import Any

from ..fmt import fmt_bytes
from ..hardware import Hardware
from ..runtime.memory_peak import MemoryPeak


class MemoryCapacityWarning(UserWarning):
    """A predicted per-rank peak is larger than one device's memory: the step would not fit there."""


def reference_hardware(device_type: str | None) -> Hardware:
    """The machine a step's memory is predicted on when none is named (the boxing planner's default)."""
    return Hardware.h100_node() if device_type == "cuda" else Hardware.cpu_box()


def device_memory(hw: Hardware) -> int | None:
    """Bytes of one device of ``hw``, or None where its model does not say (a CPU box, a hand-built one)."""
    v = getattr(hw, "memory_bytes", None)
    return int(v) if isinstance(v, (int, float)) and v > 0 else None


def over_capacity(peaks: dict[int, int], hw: Hardware) -> str | None:
    """A message naming the ranks whose peak exceeds ``hw``'s device memory, or None when all fit."""
    cap = device_memory(hw)
    if cap is None:
        return None
    over = sorted(r for r, b in peaks.items() if b > cap)
    if not over:
        return None
    worst = max(over, key=lambda r: peaks[r])
    ranks = ", ".join(map(str, over[:8])) + (f" and {len(over) - 8} more" if len(over) > 8 else "")
    dev = getattr(getattr(hw, "device", None), "name", None) or "device"
    return (f"predicted peak memory of rank {worst} is {fmt_bytes(peaks[worst])}, more than the "
            f"{fmt_bytes(cap)} of one {dev} on {hw.name!r} (ranks over capacity: {ranks}); it would not run "
            f"there: recompute activations, shard optimizer state and gradients (ZeRO), split more (tensor or "
            f"pipeline parallel) or use smaller micro-batches")


def warn_capacity(peaks: dict[int, int], hw: Hardware, stacklevel: int = 3) -> None:
    """Warn (``MemoryCapacityWarning``) when a predicted peak does not fit one device of ``hw``."""
    msg = over_capacity(peaks, hw)
    if msg is not None:
        warnings.warn(msg, MemoryCapacityWarning, stacklevel=stacklevel)


def step_memory(step: Any, hardware: Hardware | None = None, *, steps: int = 3) -> dict[int, MemoryPeak]:
    """Per rank, the predicted peak memory of ``step`` (a Compiled step or an ActorPlan) and what it holds
    then, by category: the figure ``sl.simulate(step, hardware, steps=steps).memory`` gives, and the one
    ``step.memory`` and ``step.summary()`` show. ``hardware`` None: ``reference_hardware`` of the step's
    device type. The search can call this on a candidate's compiled step to print the same figure."""
    return memory_prediction(step, hardware, steps=steps).memory


def memory_prediction(step: Any, hardware: Hardware | None = None, *, steps: int = 3) -> Any:
    """The simulated run ``step_memory`` reads (its ``memory``, and ``memory_kept``: what each rank keeps
    between steps), without the capacity warning: a view of a step, not a prediction asked for."""
    from .predict import plan_of, simulate

    if hardware is None:
        hardware = reference_hardware(plan_of(step)[0].device_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryCapacityWarning)
        return simulate(step, hardware, steps=steps)
