"""Boxing: turning one (placement, SBP) into another with collectives, exactly costed and runnable."""

from __future__ import annotations

from .kinds import KINDS, StepKind, kind_of, register
from .plan import BoxingPlan
from .planner import plan_boxing
from .route import BoxingError
from .step import BoxingStep, Transfer

__all__ = ["KINDS", "BoxingError", "BoxingPlan", "BoxingStep", "StepKind", "Transfer", "kind_of", "plan_boxing",
           "register"]
