"""What ``LocalCluster.run`` accepts besides an ActorPlan: anything that can give one.

The runtime must not know the compiler (the compiler lowers to the runtime, never the other way
round), so a compiled step is run through this small protocol: it gives its actor plan for a
cluster of ``world_size`` ranks, and turns the user's inputs into the runtime's batches (name ->
global tensor, checked against what it was compiled for). ``sl.compile(...)`` returns such an object.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..errors import InputError, InputTypeError
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


def ranks_needed(step: Any) -> int | None:
    """How many ranks a Runnable's step uses (the highest rank + 1), if it says: its ``world_size``, or
    the ranks of its physical graph (a compiled step's); None if it does not say."""
    n = getattr(step, "world_size", None)
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    ranks = getattr(getattr(step, "physical", None), "ranks", None)
    try:
        return max(ranks) + 1 if ranks else None
    except TypeError:
        return None


def plan_and_batches(step: Any, inputs: Any, world_size: int) -> tuple[ActorPlan, Batches | None]:
    """An ActorPlan with its batches as given, or a Runnable's plan and its checked feeds."""
    if isinstance(step, ActorPlan):
        return step, inputs
    if isinstance(step, Runnable):
        need = ranks_needed(step)
        if need is not None and need > world_size:
            what = getattr(getattr(step, "strategy", None), "name", None)
            raise InputError(f"this step{f' ({what})' if what else ''} uses {need} ranks but the cluster has "
                             f"{world_size}; run it on sl.LocalCluster({need}) or more, or compile it for "
                             f"{world_size} ranks")
        plan = step.plan(world_size=world_size)
        if not isinstance(plan, ActorPlan):
            raise InputTypeError(f"{type(step).__name__}.plan(world_size={world_size}) returned "
                                 f"{type(plan).__name__}, not an ActorPlan")
        return plan, step.feeds(inputs)
    raise InputTypeError(f"run needs an ActorPlan or a compiled step (sl.compile(...), or any object with "
                         f"plan(world_size=...) and feeds(inputs)); got {type(step).__name__}")
