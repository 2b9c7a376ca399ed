"""The pipeline actions a trace shows each rank running, in order: to check a run (measured or
simulated) against its schedule.

A rank's compute firings of one step, sorted by start, each named by the action its actor belongs
to (``RankSchedule.action_key``, the firing's micro-batch); consecutive firings of one action make
one entry. A run that followed its schedule gives back the schedule's action list.
"""

from __future__ import annotations

from .actor_plan import ActorPlan
from .pipeline_order import Action
from .trace import Trace


def actions_run(trace: Trace, plan: ActorPlan, step: int = 0) -> dict[int, list[Action]]:
    """Per rank with a pipeline schedule, the actions its compute lane ran in ``step``, in order."""
    out: dict[int, list[Action]] = {}
    for r, rp in plan.ranks.items():
        if rp.schedule is None:
            continue
        keys = {a.name: rp.schedule.action_key(a) for a in rp.actors}
        seq: list[Action] = []
        events = sorted((e for e in trace.events if e.rank == r and e.lane == "compute" and e.step == step
                         and keys.get(e.actor) is not None), key=lambda e: (e.start, e.end))
        for e in events:
            kind, stage = keys[e.actor]  # type: ignore[misc]
            a = Action(stage, kind, e.micro)
            if not seq or seq[-1] != a:
                seq.append(a)
        out[r] = seq
    return out
