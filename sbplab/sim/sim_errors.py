"""The simulator's one error type."""

from __future__ import annotations

from ..runtime.specs import PlanError


class SimulationError(PlanError):
    """A plan or hardware model the simulator cannot use: the message names the actor (or figure) and why."""
