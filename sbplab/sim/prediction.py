"""Prediction: what the simulator says one training step costs, in the runtime's own vocabulary.

The trace is a ``runtime.trace.Trace`` built by the same function a run uses, so
``sl.timeline(pred.trace)``, ``sbplab.viz.compare_timelines(pred.trace, result.trace)`` and
``trace.to_chrome()`` work on it unchanged. It is built on first use: the numbers do not need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from ..hardware import Hardware
from ..runtime.actor_plan import ActorPlan
from ..runtime.trace import Trace, TraceEvent, build_trace
from .engine import Firings
from .register_memory import RankPeak
from .step_pricing import StepPricing
from .timing import critical_chain

if TYPE_CHECKING:
    from ..runtime.results import RunResult
    from .compare import PredictedVsMeasured


@dataclass
class Prediction:
    """A simulated run of ``steps`` steps of ``plan`` on ``hardware``.

    step_time: steady-state seconds per step (step ends differenced over the steps after the first).
    step_ends: seconds at which each simulated step's last firing ended.
    peak_memory: per rank, the largest bytes held at once (see ``memory_breakdown`` for what).
    memory_breakdown: per rank, bytes per category (parameters, gradients, optimizer state,
        activations) at that rank's peak.
    breakdown: per rank, seconds per step: compute, exposed communication, idle (bubbles, waiting).
    measured_fraction: share of predicted kernel seconds taken from measured op times (the rest is
        the roofline); 0.0 on a spec-sheet Hardware.
    """

    plan: ActorPlan
    hardware: Hardware
    steps: int
    step_time: float
    step_ends: list[float]
    peak_memory: dict[int, int]
    memory_breakdown: dict[int, dict[str, int]]
    breakdown: dict[int, dict[str, float]]
    measured_fraction: float
    firings: Firings = field(repr=False)  # of the simulated (representative) ranks
    sent_bytes: dict[int, list[int]] = field(default_factory=dict, repr=False)  # per rank, per actor, per firing
    classes: dict[int, list[int]] = field(default_factory=dict, repr=False)  # simulated rank -> ranks alike
    window_start: float = field(default=0.0, repr=False)
    memory_at_us: dict[int, float] = field(default_factory=dict, repr=False)
    pricing: StepPricing | None = field(default=None, repr=False)  # precision, recomputation, work per step
    memory_kept: dict[int, dict[str, int]] = field(default_factory=dict, repr=False)  # per rank, held between steps

    @property
    def memory(self) -> dict[int, RankPeak]:
        """Per rank, the predicted peak and its categories: the same type as a run's ``RunResult.memory``,
        and the figure ``step.memory`` shows (``sim/memory_model.py``: one memory model)."""
        return {r: RankPeak(b, dict(self.memory_breakdown.get(r, {})), self.memory_at_us.get(r, 0.0), "simulated")
                for r, b in self.peak_memory.items()}

    # --- throughput as papers report it (Megatron-LM, PaLM) ---------------------------------------------
    @property
    def devices(self) -> int:
        """Ranks that run anything (the throughput per device divides by these)."""
        return sum(1 for rp in self.plan.ranks.values() if rp.n_actors) or self.plan.world_size

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens a second over all devices (a (batch, sequence) integer input's elements), or None."""
        p = self.pricing
        return p.tokens / self.step_time if p is not None and p.tokens and self.step_time > 0 else None

    @property
    def samples_per_second(self) -> float | None:
        p = self.pricing
        return p.samples / self.step_time if p is not None and p.samples and self.step_time > 0 else None

    @property
    def model_flops(self) -> float | None:
        """FLOPs of one step, all devices: the captured graph's forward and backward (no recomputation)."""
        return self.pricing.model_flops if self.pricing is not None and self.pricing.model_flops else None

    def tflops_per_device(self, with_recompute: bool = False) -> float | None:
        """Model TFLOP/s per device; ``with_recompute``: counting the recomputed forward too, as Megatron-LM
        reports it (Narayanan et al., SC21, eq. 3 counts four forward passes with full recomputation)."""
        f = self.model_flops
        if f is None or self.step_time <= 0:
            return None
        if with_recompute:
            f += self.pricing.recompute_flops  # type: ignore[union-attr]
        return f / self.step_time / self.devices / 1e12

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation (PaLM's definition): model FLOP/s per device over the device's peak at
        the step's compute dtype, recomputation not counted."""
        t = self.tflops_per_device()
        if t is None:
            return None
        return t * 1e12 / self.hardware.flops_for(self.pricing.compute)  # type: ignore[union-attr]

    @cached_property
    def trace(self) -> Trace:
        """Every simulated firing as a run's Trace (times in microseconds from the start)."""
        f = self.firings
        raw: dict[int, list[tuple]] = {r: [] for r in self.plan.ranks}
        nbytes = self.sent_bytes
        classes = self.classes or {r: [r] for r in self.plan.ranks}
        for j in range(len(f)):
            r, i = f.rank[j], f.node[j]
            row = (i, f.k[j], f.lane[j], f.start[j] * 1e9, f.end[j] * 1e9)
            for m in classes[r]:  # ranks alike fired at the same moments
                raw[m].append(row + (nbytes[m][i],))
        return build_trace(self.plan, self.steps, raw, {}, 0)

    @cached_property
    def critical_path(self) -> list[TraceEvent]:
        """The chain of firings that decides the last step's end: from the last firing back through
        whichever dependency (input register, free register, lane, peer) finished last. A transfer's
        start here is when it began moving data (every member posted, lanes free), not its post."""
        f, out = self.firings, []
        for j in critical_chain(f, self.window_start):
            r, i = f.rank[j], f.node[j]
            a = self.plan.ranks[r].actors[i]
            M = self.plan.micro_batches
            micro = a.scope == "micro"
            out.append(TraceEvent(r, "compute" if f.lane[j] == 0 else "comm", a.name, a.label, a.kind, a.phase,
                                  f.k[j] // M if micro else f.k[j], f.k[j] % M if micro else -1, f.k[j],
                                  f.xfer[j] * 1e6, f.end[j] * 1e6, self.sent_bytes[r][i]))
        return out

    @property
    def makespan(self) -> float:
        """Seconds from the start to the end of the last simulated step."""
        return self.step_ends[-1] if self.step_ends else 0.0

    def compare(self, result: RunResult) -> PredictedVsMeasured:
        """Predicted and measured side by side: per step, per rank and lane, per kind of actor."""
        from .compare import compare

        return compare(self, result)

    def summary(self) -> str:
        lines = [f"predicted step time {self.step_time * 1e3:.3f} ms on {self.hardware.name} "
                 f"({self.measured_fraction:.0%} of compute from measured op times)"]
        if self.mfu is not None:
            tok = self.tokens_per_second
            lines.append((f"{tok:,.0f} tokens/s, " if tok else "") + f"{self.tflops_per_device():.1f} model "
                         f"TFLOP/s per device, MFU {self.mfu:.1%}")
        lines += [f"{'rank':>4} {'compute ms':>11} {'exp. comm ms':>13} {'idle ms':>9} {'peak MB':>9}"]
        for r, b in self.breakdown.items():
            lines.append(f"{r:>4} {b['compute'] * 1e3:>11.3f} {b['exposed communication'] * 1e3:>13.3f} "
                         f"{b['idle'] * 1e3:>9.3f} {self.peak_memory[r] / 2**20:>9.2f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Prediction({self.plan.name!r}: {self.step_time * 1e3:.3f} ms/step, "
                f"peak {max(self.peak_memory.values(), default=0) / 2**20:.2f} MB/rank)")


def memory_fields(mem: dict[int, RankPeak]) -> tuple[dict[int, int], dict[int, dict[str, int]], dict[int, float]]:
    return ({r: m.peak for r, m in mem.items()}, {r: m.breakdown for r, m in mem.items()},
            {r: m.at_us for r, m in mem.items()})
