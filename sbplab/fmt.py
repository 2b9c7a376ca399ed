"""How sbplab writes sizes and durations for people: one style everywhere (decimal units)."""

from __future__ import annotations

from typing import Any


def fmt_bytes(n: Any) -> str:
    """``512 B``, ``1.5 KB``, ``2.0 MB``; ``-`` for anything that is not a number."""
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"  # unreachable: GB is the last unit


def fmt_time(seconds: float) -> str:
    """``0``, ``12.5 us``, ``3.20 ms``, ``1.50 s``."""
    if seconds == 0:
        return "0"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
