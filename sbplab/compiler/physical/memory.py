"""Per-device memory of a training step, as the compile summary shows it: a view of the one memory model.

Why a view: the simulator predicts each rank's peak from the lifetimes of the step's actor registers
(``sim/memory_model.py``), which is what the runtime holds and measures (``RunResult.memory``); an
estimate of its own here (the graph walked in order) disagreed with it by up to 2x. So the summary,
``Compiled.memory``, ``sl.simulate`` and the search print one figure, in the same categories
(parameters, gradients, optimizer state, activations), per rank.

Lifetimes follow message timing, so the figure is for a machine: the one the step was compiled for
(``sl.compile(..., hardware=)``), else the reference the boxing planner prices on
(``sim.memory_model.reference_hardware``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...fmt import fmt_bytes
from ...hardware import Hardware
from ...runtime.memory_peak import MemoryPeak


@dataclass
class RankMemory:
    """One rank's predicted peak and what it holds at that moment.

    params, grads, optimizer_state, activations_peak: bytes per category at the peak (activations: every
    micro-batch's activations alive then, boxing buffers, activation gradients).
    forward_activations: bytes of the forward outputs one micro-batch keeps for its backward (a fact of the
        graph: what a pipeline holds per micro-batch in flight).
    micro_batches_in_flight: 1: the register lifetimes already count every micro-batch whose activations
        are alive at the peak inside ``activations_peak`` (views that stack "other micro-batches in
        flight" on top show nothing twice).
    at_us: when the peak happens (simulated microseconds from the start of the run).
    kept: bytes per category the rank keeps between steps (parameters, optimizer state, gradient buffers),
        fixed by the plan; the peak's figures also hold what is in flight then (an update's next values).
    """

    rank: int
    params: int
    grads: int
    optimizer_state: int
    activations_peak: int
    micro_batches_in_flight: int = 1
    forward_activations: int = 0
    at_us: float = 0.0
    kept: dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return self.params + self.grads + self.optimizer_state + self.activations_peak

    @classmethod
    def of(cls, rank: int, m: MemoryPeak, kept: dict[str, int] | None = None) -> RankMemory:
        b = m.breakdown
        return cls(rank, b.get("parameters", 0), b.get("gradients", 0), b.get("optimizer state", 0),
                   b.get("activations", 0), at_us=m.at_us, kept=dict(kept or {}))


@dataclass
class MemoryReport:
    """Per rank, the predicted peak memory (``RankMemory``) and the machine it was predicted on."""

    ranks: dict[int, RankMemory]
    hardware: str = ""

    @classmethod
    def of(cls, peaks: dict[int, MemoryPeak], hardware: str = "",
           kept: dict[int, dict[str, int]] | None = None) -> MemoryReport:
        return cls({r: RankMemory.of(r, m, (kept or {}).get(r)) for r, m in sorted(peaks.items())}, hardware)

    def table(self) -> str:
        rows = [("rank", "parameters", "gradients", "optimizer state", "activations", "peak")]
        for r, m in sorted(self.ranks.items()):
            rows.append((str(r), fmt_bytes(m.params), fmt_bytes(m.grads), fmt_bytes(m.optimizer_state),
                         fmt_bytes(m.activations_peak), fmt_bytes(m.peak)))
        w = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        head = f"peak memory per rank (register lifetimes, simulated on {self.hardware})" if self.hardware else ""
        body = "\n".join("  ".join(v.rjust(x) for v, x in zip(row, w)) for row in rows)
        return f"{head}\n{body}" if head else body


def compiled_memory(step: Any, hardware: Hardware | None = None) -> MemoryReport:
    """The memory view of a Compiled step (``sim.memory_model.step_memory``) on ``hardware``."""
    from ...sim.memory_model import memory_prediction, reference_hardware

    hw = hardware if hardware is not None else reference_hardware(step.plan().device_type)
    pred = memory_prediction(step, hw)
    report = MemoryReport.of(pred.memory, hw.name, pred.memory_kept)
    for r, b in forward_activations(step.physical).items():
        if r in report.ranks:
            report.ranks[r].forward_activations = b
    return report


def forward_activations(phys: Any) -> dict[int, int]:
    """Per rank, bytes of the forward outputs (computed or boxed, once per micro-batch) a backward op reads."""
    nodes = phys.nodes
    read_in_backward = {ref.node for n in nodes if n.phase == "backward" for ref in n.inputs}
    out = dict.fromkeys(phys.ranks, 0)
    for n in nodes:
        if n.kind != "source" and n.phase == "forward" and n.when == "each" and n.id in read_in_backward:
            out[n.rank] = out.get(n.rank, 0) + n.out_bytes
    return out


def memory_report(d: Any, phys: Any, hardware: Hardware | None = None) -> MemoryReport:
    """The memory view of the step a deduction ``d`` and its physical graph ``phys`` make (``hardware``
    None: the deduction's, else the reference machine)."""
    from ..api import Compiled

    return compiled_memory(Compiled(d.graph, d.strategy, d, phys), hardware or getattr(d, "hardware", None))
