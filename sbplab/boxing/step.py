"""One step of a boxing plan: a collective on one mesh axis, a local slice/fill, or a move between
placements. A step carries everything a reader (or the runtime) needs: which ranks talk, how many
bytes each sends and receives, and why the step exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..layout import Block
from ..placement import Placement
from ..sbp import NdSbp, fmt_sbp
from .kinds import KINDS, StepKind


@dataclass(frozen=True)
class Transfer:
    """``src_rank`` sends the global region ``block`` of its shard to ``dst_rank`` (a move step).

    Under a partial SBP (same-shape moves only) the region is the whole local block and the payload
    is the raw addend.
    """

    src_rank: int
    dst_rank: int
    block: Block  # per tensor dim: [start, stop) in global indices

    @property
    def numel(self) -> int:
        n = 1
        for s, e in self.block:
            n *= e - s
        return n


@dataclass(frozen=True)
class BoxingStep:
    """One step of a plan. ``src_sbp``/``dst_sbp`` are the n-D SBP of the whole tensor before/after."""

    kind: str  # the name of a registered kind (``kind_obj`` is the kind itself)
    mesh_axis: int | None  # None for moves between placements
    src_sbp: NdSbp
    dst_sbp: NdSbp
    placement: Placement  # where the step runs (the destination placement for a move)
    groups: tuple[tuple[int, ...], ...]  # ranks that talk together (empty for local slice/zero steps);
    #                                      (src, dst) pairs that exchange data for a move
    bytes_sent: dict[int, int]  # per rank
    bytes_recv: dict[int, int]  # per rank
    time_s: float
    why: str
    reduce_op: str | None = None
    src_placement: Placement | None = None  # set for moves
    transfers: tuple[Transfer, ...] = field(default=())  # set for moves

    def __post_init__(self) -> None:
        kind = KINDS.get(self.kind)
        if kind is None:
            raise ValueError(f"BoxingStep.kind must be one of {tuple(KINDS)}, got {self.kind!r}")
        if kind.between_placements and self.src_placement is None:
            raise ValueError(f"a {self.kind} step moves between placements and needs src_placement")
        if not kind.between_placements and self.mesh_axis is None:
            raise ValueError(f"a {self.kind} step works on one mesh axis; mesh_axis must be set")
        if self.time_s < 0:
            raise ValueError(f"BoxingStep.time_s must be >= 0, got {self.time_s}")

    @property
    def kind_obj(self) -> StepKind:
        """The step's kind: what it means, costs, and how every executor runs it."""
        return KINDS[self.kind]

    @property
    def label(self) -> str:
        """The kind's name, with the reduce op where it reduces: ``all_reduce(max)``."""
        return self.kind_obj.label(self.reduce_op)

    @property
    def total_bytes(self) -> int:
        """Bytes sent by all ranks in this step."""
        return sum(self.bytes_sent.values())

    @property
    def max_bytes_per_rank(self) -> int:
        return max(self.bytes_sent.values(), default=0)

    def axis_text(self) -> str:
        if self.mesh_axis is None:
            return "move"
        return self.placement.axis_label(self.mesh_axis)

    def describe(self) -> str:
        return (f"{self.label} on {self.axis_text()}: {fmt_sbp(self.src_sbp)} -> {fmt_sbp(self.dst_sbp)}, "
                f"{self.max_bytes_per_rank} B max sent per rank, {self.total_bytes} B total, "
                f"~{self.time_s * 1e6:.1f} us; {self.why}")

    def __repr__(self) -> str:
        return f"BoxingStep({self.describe()})"
