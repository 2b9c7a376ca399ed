"""Finding repeated layers (``blocks.0``, ``blocks.1``, ...) so a 24-layer model draws as a few boxes.

A "unit" is a module path cut after its first numeric component: ``blocks.3.attn.q`` belongs to
unit ``blocks.3``. Units of one prefix whose ops have the same sequence of op types are the same
layer; the first and last ``keep`` stay expanded and each run of at least two identical units in
between becomes one summary node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def unit_of(module: str) -> tuple[str, int] | None:
    """``"blocks.3.attn"`` -> ``("blocks", 3)``; None for paths with no numeric component."""
    parts = module.split(".") if module else []
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i]), int(p)
    return None


def unit_name(unit: tuple[str, int]) -> str:
    return f"{unit[0]}.{unit[1]}" if unit[0] else str(unit[1])


@dataclass(frozen=True)
class RepeatGroup:
    """Units ``prefix.first`` .. ``prefix.last`` drawn as one node; they repeat ``like``'s structure."""

    prefix: str
    first: int
    last: int
    like: int  # the expanded unit they are identical to
    ops_each: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    @property
    def node_id(self) -> str:
        return f"repeat:{self.prefix}.{self.first}-{self.last}"

    @property
    def label(self) -> str:
        p = f"{self.prefix}." if self.prefix else ""
        return (f"{p}{self.first} … {p}{self.last}\n{self.count} × same as {p}{self.like}\n"
                f"{self.ops_each} ops each")


def find_repeats(op_units: Iterable[tuple[tuple[str, int] | None, str]], keep: int = 1) -> list[RepeatGroup]:
    """Groups to collapse, from ``(unit, op type)`` pairs in program order."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the expanded copy the summary refers to), got {keep}")
    sigs: dict[str, dict[int, list[str]]] = {}
    for unit, op_type in op_units:
        if unit is not None:
            sigs.setdefault(unit[0], {}).setdefault(unit[1], []).append(op_type)
    groups: list[RepeatGroup] = []
    for prefix, by_index in sigs.items():
        idx = sorted(by_index)
        ref = by_index[idx[0]]
        middle = idx[keep:len(idx) - keep]
        run: list[int] = []
        for i in middle + [None]:
            same = i is not None and by_index[i] == ref and (not run or i == run[-1] + 1)
            if same:
                run.append(i)
                continue
            if len(run) >= 2:
                groups.append(RepeatGroup(prefix, run[0], run[-1], idx[0], len(ref)))
            run = [i] if i is not None and by_index[i] == ref else []
    return groups


def collapsed_units(groups: Sequence[RepeatGroup]) -> dict[tuple[str, int], RepeatGroup]:
    return {(g.prefix, i): g for g in groups for i in range(g.first, g.last + 1)}
