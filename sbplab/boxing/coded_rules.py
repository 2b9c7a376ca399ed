"""Two rules of the route search, asked of int-coded layouts: does a layout leave every rank a
non-empty piece (``costs.state_ok``, i.e. ``layout.check_layout``), and does a one-axis step nest
(``costs.step_problem`` finds nothing).

A route search asks both of every neighbour of every layout it expands. Asked of SBP tuples, each
question hashes and compares SBP objects, which runs Python code per entry; asked of the search's
int codes (an index per entry, equal entries get equal indices), it is a few integer operations on
small tuples. These are the same rules, read off per-entry facts (which dim an entry splits, which
reduce op it holds); ``tests/test_boxing_coded_rules.py`` holds them equal to the originals on every
layout and step of several meshes and shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sbp import Partial, SbpParallel, Split

Code = tuple[int, ...]


@dataclass
class EntryFacts:
    """Per coded entry: the dim it splits (-1: not a split) and its reduce op (None: not partial)."""

    split_dim: list[int] = field(default_factory=list)
    partial_op: list[str | None] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)  # k of a strided split S(d, chunks=k), else 1

    def add(self, x: SbpParallel) -> None:
        self.split_dim.append(x.dim if isinstance(x, Split) else -1)
        self.chunks.append(x.chunks if isinstance(x, Split) else 1)
        self.partial_op.append(x.op if isinstance(x, Partial) else None)


def code_ok(code: Code, shape: tuple[int, ...], mesh_shape: tuple[int, ...], facts: EntryFacts) -> bool:
    """``state_ok``: every split dim exists and keeps at least one element per part at every level
    (balanced splits keep every piece >= the floor, so the floor chain decides)."""
    if len(code) != len(mesh_shape):
        return False
    sizes = list(shape)
    split_dim, chunks = facts.split_dim, facts.chunks
    for axis, c in enumerate(code):
        d = split_dim[c]
        if d == -1:
            continue
        if not 0 <= d < len(sizes):
            return False
        parts, k = mesh_shape[axis], chunks[c]
        if k > 1:  # a strided split: k equal chunks, each split, and the only split of its dim
            if sizes[d] % k or sum(split_dim[o] == d for o in code) > 1:
                return False
            sizes[d] //= k
        if sizes[d] < parts:
            return False
        sizes[d] //= parts
    return True


def nest_blockers(before: int, after: int, facts: EntryFacts) -> frozenset[int]:
    """The entries that, held by a later mesh axis, keep a step turning entry ``before`` into ``after``
    from nesting (``step_problem``): a later axis splitting a dim the step splits or gathers, and,
    where the step reduces a partial, a later partial of another op inside it."""
    split_dim, op = facts.split_dim, facts.partial_op
    out = {c for c in (before, after) if split_dim[c] != -1}
    mine = op[before]
    if mine is not None and op[after] is None:
        out.update(c for c, o in enumerate(op) if o is not None and o != mine)
    return frozenset(out)


def code_nests(before: int, after: int, later: Code, facts: EntryFacts) -> bool:
    """``step_problem`` finds nothing for a step turning entry ``before`` into ``after`` on an axis whose
    later axes hold ``later``."""
    return nest_blockers(before, after, facts).isdisjoint(later)
