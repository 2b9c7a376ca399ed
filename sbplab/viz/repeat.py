"""Finding repeated layers (``blocks.0``, ``blocks.1``, ...) so a 24-layer model draws as a few boxes.

A "unit" is a module path cut after its first numeric component: ``blocks.3.attn.q`` belongs to
unit ``blocks.3``. Units of one prefix whose ops have the same sequence of op types are the same
layer. Consecutive identical units form a run; each run is drawn as the unit it repeats (its first
``keep`` units, or an identical unit already drawn) and one summary node for the rest, so a change
in one layer (``blocks.0`` taking another signature) splits the runs around it instead of stopping
every layer from collapsing. The last ``keep`` units of a prefix stay expanded, to show the exit.
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
        seq = {i: tuple(by_index[i]) for i in idx}
        tail = set(idx[-keep:])  # the exit of the stack stays drawn
        drawn: dict[tuple[str, ...], int] = {}  # op types -> an expanded unit with them
        for run in _runs(idx, seq):
            ops = seq[run[0]]
            if ops in drawn:  # an identical unit is already drawn: the whole run can refer to it
                like, rest = drawn[ops], run
            else:
                like, rest = run[0], run[keep:]
                drawn[ops] = like
            rest = [i for i in rest if i not in tail]
            if len(rest) >= 2:
                groups.append(RepeatGroup(prefix, rest[0], rest[-1], like, len(ops)))
    return groups


def _runs(idx: list[int], seq: dict[int, tuple[str, ...]]) -> list[list[int]]:
    """Maximal runs of consecutive indices with the same op types."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1 and seq[i] == seq[runs[-1][-1]]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def collapsed_units(groups: Sequence[RepeatGroup]) -> dict[tuple[str, int], RepeatGroup]:
    return {(g.prefix, i): g for g in groups for i in range(g.first, g.last + 1)}
