"""What ``LocalCluster.run`` accepts besides an ActorPlan: anything that can give one.

The runtime must not know the compiler (the compiler lowers to the runtime, never the other way
round), so a compiled step is run through this small protocol: it gives its actor plan for a
cluster of ``world_size`` ranks, and turns the user's inputs into the runtime's batches (name ->
global tensor, checked against what it was compiled for). ``sl.compile(...)`` returns such an object.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..errors import InputTypeError
from .actor_plan import ActorPlan
from .results import Batches


@runtime_checkable
class Runnable(Protocol):
    """A training step the runtime can run without knowing how it was made."""

    def plan(self, world_size: int | None = None) -> ActorPlan:
        """The actor plan, for a cluster of ``world_size`` ranks (extra ranks idle)."""
        ...

    def feeds(self, inputs: Any) -> Batches:
        """``inputs`` (in whatever forms the step accepts) as batches: feed name -> global tensor."""
        ...


def plan_and_batches(step: Any, inputs: Any, world_size: int) -> tuple[ActorPlan, Batches | None]:
    """An ActorPlan with its batches as given, or a Runnable's plan and its checked feeds."""
    if isinstance(step, ActorPlan):
        return step, inputs
    if isinstance(step, Runnable):
        plan = step.plan(world_size=world_size)
        if not isinstance(plan, ActorPlan):
            raise InputTypeError(f"{type(step).__name__}.plan(world_size={world_size}) returned "
                                 f"{type(plan).__name__}, not an ActorPlan")
        return plan, step.feeds(inputs)
    raise InputTypeError(f"run needs an ActorPlan or a compiled step (sl.compile(...), or any object with "
                         f"plan(world_size=...) and feeds(inputs)); got {type(step).__name__}")
