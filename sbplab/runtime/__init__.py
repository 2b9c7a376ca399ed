"""The runtime: actor plans executed by real worker processes over torch.distributed (Gloo, NCCL).

    plan = ActorPlan.build(2, {0: [...], 1: [...]}, micro_batches=4)
    with LocalCluster(2) as cluster:
        result = cluster.run(plan, batches, steps=3)
    result.losses, result.params, result.trace.to_chrome("trace.json")
"""

from __future__ import annotations

from .actor_plan import ActorPlan, CommSlot, RankPlan
from .cluster import LocalCluster
from .faults import RunError
from .results import RunResult
from .runnable import Runnable
from .specs import (
    Accumulate,
    Actor,
    Collective,
    Compute,
    PlanError,
    Recv,
    Ref,
    Send,
    Sink,
    Source,
    State,
)
from .trace import Trace, TraceEvent

__all__ = [
    "Accumulate", "Actor", "ActorPlan", "Collective", "CommSlot", "Compute", "LocalCluster", "PlanError",
    "RankPlan", "Recv", "Ref", "RunError", "RunResult", "Runnable", "Send", "Sink", "Source", "State", "Trace",
    "TraceEvent",
]
