"""Bounded caches shared by every deduction: boxing plans, boxing costs and ranked signatures.

Each is a pure function of its key (shapes, dtypes, SBPs, placements, the hardware), so a plan made
for one deduction is right for the next. Editing a strategy changes a few ops and leaves the rest
asking the same questions; keeping the answers across deductions turns a re-deduction of a large
model into mostly dictionary lookups. The caches are LRU-bounded so a long session stays small.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from ...freeze import freeze  # noqa: F401  (re-exported: ranking and search import it from here)
from ...ops.registry import FORGETTERS

_MISSING = object()


class Memo:
    """A least-recently-used dict of at most ``maxsize`` entries."""

    def __init__(self, name: str, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"Memo {name!r}: maxsize must be >= 1, got {maxsize}")
        self.name, self.maxsize = name, maxsize
        self._d: OrderedDict[Hashable, Any] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> Any:
        """The cached value, or None (values are never None)."""
        v = self._d.get(key, _MISSING)
        if v is _MISSING:
            self.misses += 1
            return None
        self.hits += 1
        self._d.move_to_end(key)
        return v

    def put(self, key: Hashable, value: Any) -> Any:
        if value is None:
            raise ValueError(f"Memo {self.name!r} cannot store None (it means 'not cached')")
        self._d[key] = value
        self._d.move_to_end(key)
        if len(self._d) > self.maxsize:
            self._d.popitem(last=False)
        return value

    def clear(self) -> None:
        self._d.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return f"Memo({self.name!r}, {len(self)}/{self.maxsize} entries, {self.hits} hits, {self.misses} misses)"


PLANS = Memo("boxing plans", 8192)  # (shape, dtype, src, dst, src placement, dst placement, hardware) -> BoxingPlan
COSTS = Memo("boxing costs", 65536)  # (shape, dtype, src, dst, mesh shape, device type, hardware) -> BoxingCost
SCORES = Memo("scored signatures", 16384)  # an op's question (see ranking.rank_signatures) -> Candidates, best first


def clear_caches() -> None:
    """Forget every cached plan, cost and score (they are rebuilt on demand)."""
    for m in (PLANS, COSTS, SCORES):
        m.clear()


FORGETTERS.append(clear_caches)  # a rule registered from user code invalidates scored signatures
