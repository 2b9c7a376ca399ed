"""The execution simulator: a compiled step's time, memory and timeline predicted on a Hardware model.

``simulate(step, hw)`` runs the step's ActorPlan under the runtime's own firing rule on simulated
time (``engine.py``), with durations from the Hardware's measured or spec-sheet figures
(``firing_cost.py``), and returns a ``Prediction`` whose trace draws like a real run's.
"""

from __future__ import annotations

from .compare import PredictedVsMeasured
from .predict import simulate
from .prediction import Prediction
from .sim_errors import SimulationError

__all__ = ["PredictedVsMeasured", "Prediction", "SimulationError", "simulate"]
