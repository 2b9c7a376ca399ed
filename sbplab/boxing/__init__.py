"""Boxing: turning one (placement, SBP) into another with collectives, exactly costed and runnable."""

from __future__ import annotations

from .plan import BoxingPlan
from .planner import plan_boxing
from .route import BoxingError
from .step import BoxingStep, Transfer

__all__ = ["BoxingError", "BoxingPlan", "BoxingStep", "Transfer", "plan_boxing"]
