"""BoxingPlan: the steps that turn (placement, SBP) into (placement', SBP'), their bytes and time,
and a way to run them on real shards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..fmt import fmt_bytes
from ..hardware import Hardware
from ..placement import Placement
from ..sbp import NdSbp, fmt_sbp
from .execute import check_shards, run_step
from .step import BoxingStep


def dtype_name(dtype: torch.dtype) -> str:
    short = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
             torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}
    return short.get(dtype, str(dtype).replace("torch.", ""))


@dataclass(frozen=True)
class BoxingPlan:
    """How a tensor of ``shape`` goes from ``src_sbp`` on ``src_placement`` to ``dst_sbp`` on
    ``dst_placement``. An empty ``steps`` means nothing moves."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    src_placement: Placement
    dst_placement: Placement
    src_sbp: NdSbp
    dst_sbp: NdSbp
    steps: tuple[BoxingStep, ...]
    hardware: Hardware

    # --- cost ---------------------------------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        """Bytes sent by all ranks over all steps."""
        return sum(s.total_bytes for s in self.steps)

    def bytes_sent_per_rank(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.steps:
            for r, n in s.bytes_sent.items():
                out[r] = out.get(r, 0) + n
        return out

    @property
    def max_bytes_per_rank(self) -> int:
        """The most bytes any single rank sends over the whole plan."""
        return max(self.bytes_sent_per_rank().values(), default=0)

    @property
    def time_s(self) -> float:
        return sum(s.time_s for s in self.steps)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(s.kind for s in self.steps)

    @property
    def communicates(self) -> bool:
        """True when some step talks to other ranks (anything but local slices, fills and copies)."""
        return any(not s.kind_obj.is_local for s in self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    # --- text ---------------------------------------------------------------------------------
    def title(self) -> str:
        where = str(self.src_placement)
        if self.dst_placement != self.src_placement:
            where += f" -> {self.dst_placement}"
        shape = ", ".join(map(str, self.shape))
        return (f"boxing {dtype_name(self.dtype)}[{shape}] {fmt_sbp(self.src_sbp)} -> {fmt_sbp(self.dst_sbp)} "
                f"on {where}")

    def describe(self) -> str:
        """A readable table: one row per step with its collective, mesh axis, bytes and time."""
        head = (f"{self.title()}\n{len(self.steps)} step(s), {fmt_bytes(self.total_bytes)} sent in total, "
                f"{fmt_bytes(self.max_bytes_per_rank)} max per rank, ~{self.time_s * 1e6:.2f} us on "
                f"{self.hardware.name}")
        if not self.steps:
            return head + "\nnothing to do: same placement and SBP"
        rows = [("#", "step", "axis", "from -> to", "groups", "max sent/rank", "total", "time", "why")]
        for i, s in enumerate(self.steps):
            kind = s.label
            groups = " ".join("(" + ",".join(map(str, g)) + ")" for g in s.groups[:4])
            if len(s.groups) > 4:
                groups += f" +{len(s.groups) - 4}"
            rows.append((str(i), kind, s.axis_text(), f"{fmt_sbp(s.src_sbp)} -> {fmt_sbp(s.dst_sbp)}",
                         groups or "-", fmt_bytes(s.max_bytes_per_rank), fmt_bytes(s.total_bytes),
                         f"{s.time_s * 1e6:.2f} us", s.why))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
        return head + "\n" + "\n".join(line.rstrip() for line in lines)

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return (f"BoxingPlan({self.title()}: {' -> '.join(self.kinds) or 'no steps'}, "
                f"{self.total_bytes} B, ~{self.time_s * 1e6:.2f} us)")

    # --- execution ----------------------------------------------------------------------------
    def run(self, shards: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Execute every step on the shards of the source ranks; returns the destination's shards."""
        check_shards(shards, self.src_placement, self.shape, self.src_sbp, self.dst_sbp)
        cur: dict[int, torch.Tensor] = dict(shards)
        for step in self.steps:
            cur = run_step(step, cur, self.shape)
        if not self.steps:
            cur = {r: t.clone() for r, t in cur.items()}
        return cur
