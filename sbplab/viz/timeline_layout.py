"""Where a timeline puts things: the legend entry and colour of each bar, and each lane's place on the y axis.

Rows run downwards: per rank, its compute lane (one unit high) then its communication lane, taller
when many transfers are in flight at once, so that each overlapping firing keeps a slot of its own
instead of hiding behind the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .colors import firing_color
from .timeline_bars import KINDS, Bar

BAND = 0.76  # share of a lane's height its bars fill
MAX_LANE = 4.0  # the tallest a communication lane grows, in compute-lane heights
STEP_HEAD = 1.1  # the band above the top lane that holds the step labels, in compute-lane heights


class Series:
    """Which legend entry a bar belongs to, its name and colour, in the legend's order."""

    def __init__(self, axis_names: dict[int, str]) -> None:
        self.axis_names = axis_names

    def key(self, b: Bar) -> tuple:
        if b.kind == "collective":
            return (3, b.mesh_axis if b.mesh_axis is not None else 99)
        return (KINDS.index(b.kind) if b.kind in KINDS else 9, 0)

    def name(self, key: tuple, b: Bar) -> str:
        if b.kind != "collective":
            return {"p2p": "send / recv"}.get(b.kind, b.kind)
        a = b.mesh_axis
        if a is None:
            return "collectives"
        return f"collectives on {self.axis_names[a]} (mesh axis {a})" if a in self.axis_names else \
            f"collectives on mesh axis {a}"

    def color(self, b: Bar) -> str:
        return firing_color(b.kind, b.mesh_axis)


@dataclass(frozen=True)
class Lanes:
    """Where each row sits on the y axis (downwards): compute lanes one unit high, communication lanes
    taller when many transfers overlap, so each in-flight firing keeps a visible slot."""

    rows: list[str]
    top: dict[str, float]
    height: dict[str, float]
    rank_tops: list[float]  # where a new rank starts (separator lines)
    head: float = 0.0  # a band above the top lane (y < 0) for the step labels: they cover no bar

    @classmethod
    def of(cls, bars: Sequence[Bar]) -> Lanes:
        def key(b: Bar) -> tuple:
            return (str(type(b.rank)), b.rank, b.lane != "compute", b.lane)

        levels: dict[str, int] = {}
        for b in bars:
            levels[b.row] = max(levels.get(b.row, 1), b.levels)
        rows = list(dict.fromkeys(b.row for b in sorted(bars, key=key)))
        top, height, rank_tops, y, last = {}, {}, [], 0.0, None
        for row in rows:
            rank = row.split(" · ")[0]
            if last is not None and rank != last:
                rank_tops.append(y)
            last = rank
            top[row], height[row] = y, min(MAX_LANE, max(1.0, 0.45 * levels[row]))
            y += height[row]
        head = STEP_HEAD if any(b.step is not None for b in bars) else 0.0
        return cls(rows, top, height, rank_tops, head)

    @property
    def total(self) -> float:
        """The y extent: every lane and the step labels' band."""
        return sum(self.height.values()) + self.head

    def label_y(self, k: int) -> float:
        """Where the ``k``th step label sits in the band above the lanes (close steps alternate heights)."""
        return -self.head * (0.27 if k % 2 == 0 else 0.73)

    def y(self, b: Bar) -> tuple[float, float]:
        """(centre, thickness) of a bar: overlapping firings of a lane share its band side by side."""
        h = self.height[b.row]
        slot = h * BAND / max(1, b.levels)
        return self.top[b.row] + h * (1 - BAND) / 2 + (b.level + 0.5) * slot, slot * 0.9

    def axis(self) -> dict[str, Any]:
        return dict(tickvals=[self.top[r] + self.height[r] / 2 for r in self.rows], ticktext=self.rows,
                    range=[self.total - self.head, -self.head], showgrid=False, zeroline=False, type="linear")
