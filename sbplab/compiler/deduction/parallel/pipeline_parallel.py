"""Pipeline parallel as a rule: the mesh cut into stages along a named axis (``pp``), the forward cut
into contiguous runs of layers, one per stage, and each step's batch into micro-batches, run in the
order of a schedule (``compiler/pipeline/schedules.py``). Interleaved 1F1B gives each rank of the
axis several stages: stage s on index s % n of the axis, so the forward goes round the ranks
``stages_per_rank`` times."""

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

from ...pipeline.schedules import SCHEDULES, pipeline_actions


@dataclass(frozen=True)
class Pipeline(ParallelRule):
    """Stages along mesh axis ``axis`` (each index of it is one stage; the other axes form each stage's
    mesh, on which the other rules work), ``micro_batches`` per step, ``stage_of`` module prefixes pinned
    to stages (otherwise cuts balance FLOPs against the messages they need, ``staging.py``).

    ``stages``, when given, must equal the axis's size (a check that the mesh is the one meant).
    ``schedule`` names the order each rank runs its forwards and backwards in (``SCHEDULES``:
    "gpipe", "1f1b", "interleaved_1f1b"); the compiler gives every rank its action list, which the
    runtime, the simulator and the communication order all follow.
    ``stages_per_rank``: stages each rank of the axis holds (interleaved 1F1B only; default 2 there,
    1 otherwise); ``stage_of`` then numbers the ``n * stages_per_rank`` stages."""

    axis: str | int = "pp"
    micro_batches: int = 1
    stages: int | None = None
    schedule: str = "1f1b"
    stage_of: dict[str, int] = field(default_factory=dict, hash=False, compare=False)
    stages_per_rank: int | None = None

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise InputError(f"Pipeline schedule must be one of {', '.join(map(repr, SCHEDULES))}; "
                             f"got {self.schedule!r}")
        if not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise InputError(f"Pipeline micro_batches must be an int >= 1, got {self.micro_batches!r}")
        v = self.stages_per_rank
        if v is not None and (not isinstance(v, int) or v < 1):
            raise InputError(f"Pipeline stages_per_rank must be an int >= 1, got {v!r}")
        if v not in (None, 1) and self.schedule != "interleaved_1f1b":
            raise InputError(f"Pipeline(stages_per_rank={v}) needs schedule='interleaved_1f1b' (the "
                             f"{self.schedule!r} schedule runs one stage per rank)")

    @property
    def virtual(self) -> int:
        """Stages per rank of the axis."""
        return self.stages_per_rank or (2 if self.schedule == "interleaved_1f1b" else 1)

    def setup(self, strategy: Strategy) -> None:
        if strategy.stages is not None:  # already cut (a copy of a strategy set up before)
            return
        full = strategy.placement
        a = resolve_axis(full, self.axis, "Pipeline")
        n = full.shape[a]
        if self.stages is not None and self.stages != n:
            raise InputError(f"Pipeline(stages={self.stages}) but mesh axis {full.axis_label(a)} has {n} ranks; "
                             f"make them equal (one stage per index of the axis)")
        pipeline_actions(self.schedule, n, self.micro_batches, self.virtual)  # refuses what the schedule cannot run
        names = tuple(x for i, x in enumerate(full.axis_names) if i != a) if full.axis_names else None
        if full.ndim == 1:  # one rank per stage
            stages = [Placement(full.device_type, [int(r)], names or None) for r in full.mesh]
        else:
            stages = [Placement(full.device_type, np.take(full.mesh, i, axis=a).tolist(), names) for i in range(n)]
        stages = [stages[s % n] for s in range(n * self.virtual)]  # interleaved: round the ranks again
        strategy.stages = stages
        strategy.placement = stages[0]
        strategy.micro_batches = self.micro_batches
        strategy.stage_of.update(self.stage_of)
        for s in strategy.stage_of.values():
            if not 0 <= s < len(stages):
                raise InputError(f"Pipeline stage_of names stage {s}, but there are {len(stages)} stages")

    def resolve(self, graph: Graph, strategy: Strategy) -> RuleUse:
        per = f" ({self.virtual} per rank)" if self.virtual > 1 else ""
        return RuleUse([], [f"{strategy.n_stages} stages{per} x {strategy.micro_batches} micro-batches, "
                            f"schedule {self.schedule}" + (f", stage_of {self.stage_of}" if self.stage_of else "")])

    def describe(self) -> str:
        per = f", stages_per_rank={self.virtual}" if self.virtual > 1 else ""
        return f"Pipeline({self.axis!r}, micro_batches={self.micro_batches}, schedule={self.schedule!r}{per})"
