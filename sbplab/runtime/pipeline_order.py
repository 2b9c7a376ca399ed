"""A pipeline schedule as data the runtime reads: each rank's compute order within a step.

A pipeline schedule (GPipe, 1F1B, interleaved 1F1B; ``sbplab.compiler.pipeline.schedules`` makes
them) is, per rank, a list of actions: the forward of micro-batch m on stage s, or its backward (as
torch.distributed.pipelining's ``_Action``: stage, computation type, micro-batch). The compiler
files each rank's list with the stage of every actor (``RankSchedule``), and the firing rule
(``firing.FiringGraph``) holds a micro-batch compute firing until every action before its own in
the list has finished on that rank. So the executor, the simulator and the derivation of the
communication order all run a pipeline's compute in the schedule's order, whatever the link speed:
when a gradient arrives late the compute lane waits for it instead of starting the next forward,
and what the rank holds (and so its peak memory) follows the schedule, not the timing.

Why "finished", not "started": a rank has one compute lane, so the two agree in a run; in the
counters "finished" keeps the rule monotone (a firing's permission only ever goes from no to yes),
which the proof that a derived communication order cannot deadlock relies on (``schedule.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

FORWARD, BACKWARD = "F", "B"
_KIND_OF_PHASE = {"forward": FORWARD, "backward": BACKWARD}


@dataclass(frozen=True, order=True)
class Action:
    """One unit of a pipeline schedule: ``kind`` ("F" forward, "B" the full backward: input and weight
    gradients) of micro-batch ``micro`` on pipeline stage ``stage``. Written as torch writes its
    ``_Action``: "1F0" is stage 1's forward of micro-batch 0."""

    stage: int
    kind: str
    micro: int

    def __post_init__(self) -> None:
        if self.kind not in (FORWARD, BACKWARD):
            raise ValueError(f"Action kind must be 'F' or 'B', got {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro}"


@dataclass(frozen=True)
class RankSchedule:
    """One rank's pipeline schedule within a step.

    name: the schedule ("gpipe", "1f1b", "interleaved_1f1b").
    actions: this rank's actions in order; every step runs them again.
    stage_of: the pipeline stage of each actor of this rank (by name); a micro-batch compute actor
        with phase forward or backward belongs to the action (its phase, its stage, the firing's
        micro-batch). Actors not named here (step actors, communication) are not held back.
    """

    name: str
    actions: tuple[Action, ...]
    stage_of: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)

    def position(self) -> dict[tuple[str, int, int], int]:
        """(kind, stage, micro) -> its place in ``actions``."""
        return {(a.kind, a.stage, a.micro): i for i, a in enumerate(self.actions)}

    def action_key(self, actor) -> tuple[str, int] | None:
        """(kind, stage) of the actions ``actor`` takes part in, or None if the schedule does not hold
        it back. A fused chain (``fusion.Fused``) goes with its first part, which every later part
        depends on, so it is never later in a valid schedule than any of them."""
        if actor.lane == "comm" or actor.scope != "micro":
            return None
        parts = getattr(actor, "parts", None)
        head = parts[0] if parts else actor
        kind = _KIND_OF_PHASE.get(head.phase)
        stage = self.stage_of.get(head.name)
        if kind is None or stage is None:
            return None
        return kind, stage


def in_flight(actions: tuple[Action, ...] | list[Action]) -> dict[int, int]:
    """Per stage, the most micro-batches whose forward has run and backward has not, at any point of
    ``actions``: how many activations of that stage the schedule keeps alive at once (the registers its
    actors need)."""
    live: dict[int, int] = {}
    most: dict[int, int] = {}
    for a in actions:
        live[a.stage] = live.get(a.stage, 0) + (1 if a.kind == FORWARD else -1)
        most[a.stage] = max(most.get(a.stage, 0), live[a.stage])
    return most
