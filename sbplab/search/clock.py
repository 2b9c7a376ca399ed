"""A search's time budget and its record of the best cost found over time (for ``res.plot()``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Clock:
    """Seconds since the search began, whether the budget ran out, and the best cost per method over time."""

    budget: float | None = None  # seconds, None: no limit
    start: float = field(default_factory=time.perf_counter)
    history: list[tuple[str, float, float]] = field(default_factory=list)  # (method, seconds, best cost)
    ran_out: bool = False
    _best: dict[str, float] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float | None:
        return None if self.budget is None else max(0.0, self.budget - self.elapsed())

    def expired(self) -> bool:
        if self.budget is not None and self.elapsed() >= self.budget:
            self.ran_out = True
        return self.ran_out

    def record(self, method: str, cost: float) -> None:
        """Note a candidate's cost; the history keeps only improvements, per method."""
        if cost < self._best.get(method, float("inf")):
            self._best[method] = cost
            self.history.append((method, self.elapsed(), cost))
