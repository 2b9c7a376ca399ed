"""Local steps: nothing crosses a rank. ``slice`` (B -> S: keep my piece) and ``zero`` (B or S -> P:
hold an addend of the value, the reduce op's identity around or instead of my data). Both take a
strided split ``S(d, chunks=k)`` too: my piece of each of the k chunks, end to end.

Both lower to a small kernel defined here, and their in-process run calls that same kernel for
every rank, so the executor in one process and the workers cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ...layout import local_shape, numel, partial_fill, split_range
from ...sbp import B, Broadcast, NdSbp, Partial, SbpParallel, Split
from .kind_base import StepKind
from .kind_registry import register

if TYPE_CHECKING:
    from ..step import BoxingStep


# --- kernels (``f(inputs, attrs) -> outputs``, as the runtime calls them) ------------------------------
def narrow_piece(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """B -> S(dim) on one rank: keep my balanced piece ``[start, start + length)`` of ``dim``; under a
    strided split (``chunks`` > 1) that piece of each of the chunks, end to end."""
    x, d, a, n = inputs[0], attrs["dim"], attrs["start"], attrs["length"]
    k = attrs.get("chunks", 1)
    if k == 1:
        return (x.narrow(d, a, n).clone(),)
    c = x.shape[d] // k
    return (torch.cat([x.narrow(d, j * c + a, n) for j in range(k)], dim=d),)


narrow_piece.where_attrs = ("start",)  # type: ignore[attr-defined]  # where the piece lies, not its size (sim/alike.py)


def to_partial(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """B or S(dim) -> P on one rank.

    mode "keep": this rank keeps the value; "fill": it holds the reduce op's identity instead;
    "embed": my S piece placed at ``start`` of ``dim`` inside a ``shape`` buffer of the identity.
    """
    x = inputs[0]
    mode = attrs["mode"]
    if mode == "keep":
        return (x.clone(),)
    if mode == "fill":
        return (partial_fill(attrs["fill"], x),)
    buf = partial_fill(attrs["fill"], x.new_empty(tuple(attrs["shape"])))
    d, k = attrs["dim"], attrs.get("chunks", 1)
    n, c = x.shape[d] // k, buf.shape[d] // k  # a strided split's piece: its slice of each of k chunks
    for j in range(k):
        buf.narrow(d, j * c + attrs["start"], n).copy_(x.narrow(d, j * n, n))
    return (buf,)


def fill_op(state: NdSbp, axis: int, op: str, coords: tuple[int, ...]) -> str:
    """Whose identity fills the outside of my slice when ``state[axis]`` becomes ``P(op)``.

    Under a later ``P`` (sum) axis the outer identity must itself be split into addends: one rank of
    that inner axis holds it, the others hold 0. (For floats ``-inf + -inf`` happens to stay ``-inf``,
    but for integers ``iinfo.min + iinfo.min`` overflows.)
    """
    if op == "sum":
        return op
    for j in range(axis + 1, len(state)):
        if isinstance(state[j], Partial) and state[j].op == "sum" and coords[j] != 0:
            return "sum"
    return op


class LocalKind(StepKind):
    """A step each rank does alone with one kernel; the in-process run is that kernel on every rank."""

    lowering = "kernel"

    def rank_elements(self, piece, old, new, p, i) -> tuple[int, int, int]:
        return 0, 0, 0

    def apply(self, step: BoxingStep, group, xs, shape) -> list[torch.Tensor]:
        out = []
        for r, x in zip(group, xs):
            fn, attrs = self.kernel(step, r, tuple(x.shape), shape)
            out.append(fn([x], attrs)[0])
        return out


class SliceKind(LocalKind):
    """B -> S(i): every rank holds the whole piece and keeps its balanced slice. 0 bytes."""

    name = "slice"

    def turns(self, old: SbpParallel, new: SbpParallel) -> bool:
        return isinstance(old, Broadcast) and isinstance(new, Split)

    def explain(self, old, new, axis_label: str) -> str:
        return f"every rank on {axis_label} holds the whole piece and keeps only its {new!r} slice"

    def kernel(self, step: BoxingStep, rank: int, in_shape: Sequence[int],
               shape: tuple[int, ...]) -> tuple[Callable, dict[str, Any]]:
        axis, pl = step.mesh_axis, step.placement
        new = step.dst_sbp[axis]
        group = pl.group_of(rank, axis)
        a, b = split_range(in_shape[new.dim] // new.chunks, len(group), group.index(rank))
        more = {"chunks": new.chunks} if new.chunks > 1 else {}
        return narrow_piece, {"dim": new.dim, "start": a, "length": b - a, **more}


class ZeroKind(LocalKind):
    """B -> P: the first rank keeps the value, the others hold the identity (for sum; any copy is a
    valid candidate of max/min). S(i) -> P: my slice inside a buffer of the identity. 0 bytes; the
    time is the memory write of the filled buffer."""

    name = "zero"

    def turns(self, old: SbpParallel, new: SbpParallel) -> bool:
        return isinstance(new, Partial) and isinstance(old, (Broadcast, Split))

    def rank_elements(self, piece, old, new, p, i) -> tuple[int, int, int]:
        writes = isinstance(old, Split) or (new.op == "sum" and i != 0)
        return 0, 0, numel(piece) if writes else 0

    def explain(self, old, new, axis_label: str) -> str:
        if isinstance(old, Broadcast):
            if new.op == "sum":
                return f"the first rank on {axis_label} keeps the value, the others hold zeros (a {new!r} addend)"
            return f"every rank on {axis_label} keeps its copy, a valid {new!r} candidate"
        return f"each rank on {axis_label} puts its {old!r} slice into a tensor filled with the identity of {new.op}"

    def kernel(self, step: BoxingStep, rank: int, in_shape: Sequence[int],
               shape: tuple[int, ...]) -> tuple[Callable, dict[str, Any]]:
        axis, pl = step.mesh_axis, step.placement
        old, new = step.src_sbp[axis], step.dst_sbp[axis]
        group = pl.group_of(rank, axis)
        i, p = group.index(rank), len(group)
        if isinstance(old, Broadcast):
            keep = new.op != "sum" or i == 0
            return to_partial, {"mode": "keep" if keep else "fill", "fill": new.op}
        whole = step.src_sbp[:axis] + (B,) + step.src_sbp[axis + 1:]  # the group's piece
        piece = local_shape(shape, pl, whole, rank)
        more = {"chunks": old.chunks} if old.chunks > 1 else {}
        return to_partial, {"mode": "embed", "dim": old.dim, "shape": piece,
                            "start": split_range(piece[old.dim] // old.chunks, p, i)[0],
                            "fill": fill_op(step.src_sbp, axis, new.op, pl.coords(rank)), **more}


register(SliceKind())
register(ZeroKind())
