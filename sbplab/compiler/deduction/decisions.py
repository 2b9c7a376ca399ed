"""The records deduction keeps: every boxing it inserts, and every op's chosen signature with reasons.

They are what explanations print and what lowering expands; each boxing knows its tensor, its
from/to layouts and placements, its plan (steps, bytes, time), why it exists and who reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...boxing import BoxingPlan
from ...ops.registry import NdSignature
from ...placement import Placement
from ...sbp import NdSbp, fmt_sbp


@dataclass
class Boxing:
    """One SBP change of one tensor: for a consumer's input, a store hint, a use hint or a write-back."""

    id: int
    tensor: str
    kind: str  # "input" | "store" | "use" | "write_back"
    src_sbp: NdSbp
    dst_sbp: NdSbp
    src_placement: Placement
    dst_placement: Placement
    plan: BoxingPlan
    phase: str
    stage: int
    reason: str
    consumers: list[str] = field(default_factory=list)  # ops that read the boxed value
    source: int | None = None  # id of the boxing whose output this one starts from (after a use boxing)

    @property
    def bytes(self) -> int:
        return self.plan.total_bytes

    def describe(self) -> str:
        steps = " -> ".join(self.plan.kinds) or "no data moves"
        return (f"box {self.tensor} {fmt_sbp(self.src_sbp)} -> {fmt_sbp(self.dst_sbp)}: {steps}, "
                f"{self.bytes} B ({self.kind}; {self.reason})")


@dataclass
class OpChoice:
    """The signature an op got, where each input is read from, and why."""

    op: str
    signature: NdSignature
    cost: int
    reads: list[int | None]  # per input: the boxing it reads through, or None (the tensor as stored)
    reason: str
    rejected: list[tuple[NdSignature, int]]
