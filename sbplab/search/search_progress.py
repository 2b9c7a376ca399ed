"""Progress of a running ``sl.search``, for whoever shows it (a bar and the best cost so far).

A search runs for seconds to minutes, and the person waiting wants to see it move. Its work comes in
units: pricing one preset, solving one space (a mesh and a ZeRO level, or a pipeline's stage mesh
and micro-batch count), simulating one of the finalists. ``on_progress(SearchProgress)`` is called
after each unit, in the caller's thread; without a callback nothing is counted and nothing extra
is computed, so a search without one behaves exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .candidate import Candidate
from .clock import Clock

PHASES = ("presets", "meshes", "pipelines", "simulating", "done")


@dataclass(frozen=True)
class SearchProgress:
    """Where a running search stands: a snapshot handed to ``on_progress``."""

    phase: str  # one of PHASES: what the search is doing now ("done": it has finished)
    done: int  # units of work finished (presets priced, spaces solved, finalists simulated)
    total: int  # units the search plans to do; fewer get done when the time budget runs out
    best_time: float  # analytic seconds per step of the best searched candidate within the memory limit (inf: none)
    best: str  # that candidate's description ("searched (cd): mesh 2x4"), "" while there is none
    seconds: float  # since the search began

    @property
    def fraction(self) -> float:
        """0..1 for a progress bar; 1 once the search is done."""
        if self.phase == "done":
            return 1.0
        return min(1.0, self.done / self.total) if self.total else 0.0


ProgressCallback = Callable[[SearchProgress], None]


class ProgressReporter:
    """Counts units of work and calls the callback after each; does nothing without a callback."""

    def __init__(self, callback: ProgressCallback | None, clock: Clock, memory_limit: float | None) -> None:
        self.callback, self.clock, self.memory_limit = callback, clock, memory_limit
        self.done = self.total = 0
        self.best_time, self.best = float("inf"), ""

    @property
    def active(self) -> bool:
        return self.callback is not None

    def plan(self, units: int) -> None:
        """``units`` more units of work lie ahead."""
        self.total += units

    def step(self, phase: str, candidate: Candidate | None = None) -> None:
        """One unit finished in ``phase``; ``candidate``: a searched candidate it produced, if any."""
        if self.callback is None:
            return
        self.done += 1
        if candidate is not None and candidate.feasible(self.memory_limit) and candidate.step_time < self.best_time:
            self.best_time, self.best = candidate.step_time, candidate.describe()
        self._emit(phase)

    def finish(self, winner: Candidate) -> None:
        """The search is over and ``winner`` is what it returns (re-ranked by the simulator, maybe)."""
        if self.callback is None:
            return
        self.done = self.total = max(self.done, self.total)
        self.best_time, self.best = winner.step_time, winner.describe()
        self._emit("done")

    def _emit(self, phase: str) -> None:
        self.callback(SearchProgress(phase, self.done, max(self.total, self.done), self.best_time, self.best,
                                     self.clock.elapsed()))
