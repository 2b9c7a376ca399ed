"""Explain records: why an op picked its signature and what every boxing cost.

Every eager op and every SBP change leaves one record on the tensor it produced, and on any
``explain_log()`` that is open. The records answer the question users of OneFlow, DTensor and
JAX keep asking: "why was an all-gather inserted here, and what did it cost?"
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..fmt import fmt_bytes, fmt_time
from ..ops.choose import RankedSignature
from ..sbp import NdSbp, fmt_sbp


@dataclass
class BoxingRecord:
    """One SBP change: which tensor, from what to what, why, and the plan that does it."""

    tensor: str  # the tensor's name
    reason: str  # e.g. "input 0 of matmul under signature (S(1), S(0)) -> P"
    plan: Any  # sbplab.boxing.BoxingPlan

    @property
    def total_bytes(self) -> int:
        return int(self.plan.total_bytes)

    @property
    def time_s(self) -> float:
        return float(self.plan.time_s)

    def lines(self) -> list[str]:
        p = self.plan
        src = fmt_sbp(p.src_sbp)
        dst = fmt_sbp(p.dst_sbp)
        where = "" if p.dst_placement == p.src_placement else f" to {p.dst_placement}"
        head = (f"boxing {self.tensor} {tuple(p.shape)}: {src} -> {dst}{where}  ({self.reason}); "
                f"{fmt_bytes(p.total_bytes)} sent in all, est. {fmt_time(p.time_s)}")
        out = [head]
        if not p.steps:
            out.append("    no data moves")
        for s in p.steps:
            out.append("    " + s.describe())
        return out


@dataclass
class OpRecord:
    """One eager op: its inputs' SBPs, the chosen signature, the rejected ones, the boxings."""

    op: str
    output: str
    input_names: list[str]
    input_sbps: list[NdSbp]
    chosen: RankedSignature
    rejected: list[RankedSignature]
    boxings: list[BoxingRecord] = field(default_factory=list)
    forced: str = ""  # "signature" or "output sbp" when the user forced a choice

    def lines(self, max_rejected: int = 6) -> list[str]:
        ins = ", ".join(f"{n}:{fmt_sbp(s)}" for n, s in zip(self.input_names, self.input_sbps))
        how = f" (forced {self.forced})" if self.forced else ""
        out = [f"{self.output} = {self.op}({ins})",
               f"  chosen signature{how}: {self.chosen.signature}  "
               f"boxing {fmt_bytes(self.chosen.boxing_bytes)}, est. {fmt_time(self.chosen.boxing_time_s)}"]
        if self.rejected:
            out.append(f"  rejected ({len(self.rejected)}), cheapest first:")
            for c in self.rejected[:max_rejected]:
                out.append(f"    {str(c.signature):<48} boxing {fmt_bytes(c.boxing_bytes):>10}, "
                           f"est. {fmt_time(c.boxing_time_s)}")
            if len(self.rejected) > max_rejected:
                out.append(f"    ... {len(self.rejected) - max_rejected} more")
        for b in self.boxings:
            out += ["  " + line for line in b.lines()]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


Record = OpRecord | BoxingRecord


class ExplainLog:
    """Collects every record made while it is open; ``print(log)`` shows them in order."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    @property
    def boxings(self) -> list[BoxingRecord]:
        out: list[BoxingRecord] = []
        for r in self.records:
            out += r.boxings if isinstance(r, OpRecord) else [r]
        return out

    @property
    def total_bytes(self) -> int:
        return sum(b.total_bytes for b in self.boxings)

    def collectives(self) -> dict[str, int]:
        """How many steps of each kind ran, like DTensor's CommDebugMode counts."""
        counts: dict[str, int] = {}
        for b in self.boxings:
            for s in b.plan.steps:
                counts[s.kind] = counts.get(s.kind, 0) + 1
        return counts

    def __str__(self) -> str:
        lines: list[str] = []
        for r in self.records:
            lines += r.lines() if isinstance(r, OpRecord) else r.lines()
        lines.append(f"total: {len(self.records)} records, {fmt_bytes(self.total_bytes)} moved, "
                     f"steps {self.collectives()}")
        return "\n".join(lines)

    __repr__ = __str__


_OPEN_LOGS: list[ExplainLog] = []


def emit(record: Record) -> None:
    for log in _OPEN_LOGS:
        log.records.append(record)


@contextmanager
def explain_log() -> Iterator[ExplainLog]:
    """``with sl.explain_log() as log: ...`` then ``print(log)``."""
    log = ExplainLog()
    _OPEN_LOGS.append(log)
    try:
        yield log
    finally:
        _OPEN_LOGS.remove(log)
