"""Parsing what people type into widget text boxes, with messages that say what would be valid."""

from __future__ import annotations

import re


def parse_dims(text: str, what: str, max_dims: int, max_total: int | None = None) -> tuple[int, ...]:
    """``"8, 6"``, ``"(8, 6)"``, ``"8x6"`` or ``"[8 6]"`` -> ``(8, 6)``; every entry a positive int."""
    body = text.strip().strip("()[]").strip()
    body = re.sub(r"(?<=\d)\s*[x×*]\s*(?=\d)", ",", body)  # 8x6 and 8 × 6 read as 8, 6
    items = [s for s in re.split(r"[,\s]+", body) if s]
    if not items:
        raise ValueError(f"{what} is empty; write sizes like '8, 6'")
    dims = []
    for s in items:
        if not re.fullmatch(r"\d+", s):
            raise ValueError(f"{what} {text.strip()!r}: {s!r} is not a whole number; write sizes like '8, 6'")
        n = int(s)
        if n < 1:
            raise ValueError(f"{what} {text.strip()!r}: sizes must be >= 1, got {n}")
        dims.append(n)
    if len(dims) > max_dims:
        raise ValueError(f"{what} {text.strip()!r} has {len(dims)} dims; at most {max_dims} are shown here")
    if max_total is not None:
        total = 1
        for n in dims:
            total *= n
        if total > max_total:
            raise ValueError(f"{what} {text.strip()!r} has {total} entries; "
                             f"at most {max_total} are shown here")
    return tuple(dims)
