"""Pipeline parallel as a rule: the mesh cut into stages along a named axis (``pp``), the forward cut
into contiguous runs of layers, one per stage, and each step's batch into micro-batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ....errors import InputError
from ....placement import Placement
from .base import ParallelRule, RuleUse, resolve_axis

if TYPE_CHECKING:
    from ...ir import Graph
    from ..strategy import Strategy

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


@dataclass(frozen=True)
class Pipeline(ParallelRule):
    """Stages along mesh axis ``axis`` (each index of it is one stage; the other axes form each stage's
    mesh, on which the other rules work), ``micro_batches`` per step, ``stage_of`` module prefixes pinned
    to stages (otherwise cuts balance FLOPs against the messages they need, ``staging.py``).

    ``stages``, when given, must equal the axis's size (a check that the mesh is the one meant).
    ``schedule`` names the order micro-batches run in (``SCHEDULES``); it is recorded on the strategy
    (``strategy.schedule``) for the runtime and the simulator to read."""

    axis: str | int = "pp"
    micro_batches: int = 1
    stages: int | None = None
    schedule: str = "1f1b"
    stage_of: dict[str, int] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise InputError(f"Pipeline schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise InputError(f"Pipeline micro_batches must be an int >= 1, got {self.micro_batches!r}")

    def setup(self, strategy: Strategy) -> None:
        if strategy.stages is not None:  # already cut (a copy of a strategy set up before)
            return
        full = strategy.placement
        a = resolve_axis(full, self.axis, "Pipeline")
        n = full.shape[a]
        if self.stages is not None and self.stages != n:
            raise InputError(f"Pipeline(stages={self.stages}) but mesh axis {full.axis_label(a)} has {n} ranks; "
                             f"make them equal (one stage per index of the axis)")
        names = tuple(x for i, x in enumerate(full.axis_names) if i != a) if full.axis_names else None
        if full.ndim == 1:  # one rank per stage
            stages = [Placement(full.device_type, [int(r)], names or None) for r in full.mesh]
        else:
            stages = [Placement(full.device_type, np.take(full.mesh, i, axis=a).tolist(), names) for i in range(n)]
        strategy.stages = stages
        strategy.placement = stages[0]
        strategy.micro_batches = self.micro_batches
        strategy.stage_of.update(self.stage_of)
        for s in strategy.stage_of.values():
            if not 0 <= s < n:
                raise InputError(f"Pipeline stage_of names stage {s}, but there are {n} stages")

    def resolve(self, graph: Graph, strategy: Strategy) -> RuleUse:
        return RuleUse([], [f"{strategy.n_stages} stages x {strategy.micro_batches} micro-batches, "
                            f"schedule {self.schedule}" + (f", stage_of {self.stage_of}" if self.stage_of else "")])

    def describe(self) -> str:
        return f"Pipeline({self.axis!r}, micro_batches={self.micro_batches}, schedule={self.schedule!r})"
