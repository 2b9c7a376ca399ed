"""A shortcut the compiler takes by default, and the switch that turns it off.

Identical layers captured from two of them, or deduced once, are shortcuts: tests and benchmarks
measure each against the long way it replaces, inside ``with SHORTCUT.off():``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class Shortcut:
    """On unless a ``with shortcut.off():`` block is running (process-wide, not thread-local)."""

    def __init__(self) -> None:
        self.on = True

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        before, self.on = self.on, False
        try:
            yield
        finally:
            self.on = before
