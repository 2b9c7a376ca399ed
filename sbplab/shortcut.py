"""A shortcut sbplab takes by default, and the switch that turns it off.

Identical layers captured from two of them or deduced once, shapes and FLOPs by formula instead of a
meta kernel: each is a shortcut, and tests and benchmarks measure it against the long way it replaces,
inside ``with SHORTCUT.off():``.
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
