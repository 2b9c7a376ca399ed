"""SBP: how a tensor is laid out over one mesh axis (split, broadcast, partial).

An n-D SBP is a plain tuple with one entry per mesh axis, applied in order: mesh axis 0 first, then
axis 1 splits each piece that axis 0 left (OneFlow's and DTensor's order). Strings such as
``"S(0), B"`` parse to the same tuple, so users can write layouts the way papers do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import InputTypeError, SbpError

REDUCE_OPS = ("sum", "max", "min")


@dataclass(frozen=True)
class Split:
    """S(dim): the tensor is cut along ``dim``, each device of the axis holds one balanced piece.

    ``chunks`` > 1 is a strided split, ``S(dim, chunks=k)``: ``dim`` is ``k`` equal chunks laid end to end
    (a fused QKV layer's output: q, k, v) and each chunk is split over the axis, so a device holds its
    piece of every chunk, in chunk order. A contiguous split would hand rank 0 all of q and part of k;
    this one hands it its heads of q, of k and of v, and a split of the tensor into its k chunks is then
    a plain ``S(dim)`` of each. (DTensor's ``_StridedShard(dim, split_factor=k)``; Megatron stores fused
    QKV weights in this order.)
    """

    dim: int
    chunks: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or isinstance(self.dim, bool):
            raise InputTypeError(f"S(dim) needs an int dim, got {self.dim!r}")
        if not isinstance(self.chunks, int) or isinstance(self.chunks, bool) or self.chunks < 1:
            raise InputTypeError(f"S(dim, chunks) needs an int chunks >= 1, got {self.chunks!r}")

    def __repr__(self) -> str:
        return f"S({self.dim})" if self.chunks == 1 else f"S({self.dim}, chunks={self.chunks})"


@dataclass(frozen=True)
class Broadcast:
    """B: every device of the axis holds the whole tensor."""

    def __repr__(self) -> str:
        return "B"


@dataclass(frozen=True)
class Partial:
    """P: every device holds an addend (or a candidate, for max/min); reducing them gives the value.

    ``P`` is the partial sum. ``P("max")`` and ``P("min")`` are DTensor's extension; ops accept them
    only where that is mathematically right (relu of P(max) is fine, matmul of P(max) is not).
    Calling a Partial gives another reduce op, so ``sl.P("max")`` reads like the paper.
    """

    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in REDUCE_OPS:
            raise SbpError(f"P(op) needs op in {REDUCE_OPS}, got {self.op!r}")

    def __call__(self, op: str) -> Partial:
        return Partial(op)

    def __repr__(self) -> str:
        return "P" if self.op == "sum" else f"P({self.op})"


SbpParallel = Split | Broadcast | Partial
NdSbp = tuple  # tuple[SbpParallel, ...], one entry per mesh axis

B = Broadcast()
P = Partial("sum")


def S(dim: int, chunks: int = 1) -> Split:
    """Split along tensor dimension ``dim`` (negative dims are normalised against the tensor's rank);
    ``chunks=k``: the strided split of ``k`` equal chunks (see ``Split``)."""
    return Split(dim, chunks)


_TOKEN = re.compile(r"\s*(S\s*\(\s*(-?\d+)\s*(?:,\s*(?:chunks\s*=\s*)?(\d+)\s*)?\)|B|P\s*\(\s*(sum|max|min)\s*\)|P)"
                    r"\s*(,|$)")


def _encloses(body: str) -> bool:
    """``body`` is one parenthesised group: its first ``(`` closes at its last character."""
    depth = 0
    for i, ch in enumerate(body):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return i == len(body) - 1
    return False


def parse_sbp(text: str) -> NdSbp:
    """Parse ``"S(0), B"`` or ``"(P, S(1))"`` into a tuple of SBPs; ``fmt_sbp``'s text parses back."""
    if not isinstance(text, str):
        raise InputTypeError(f"parse_sbp needs a string like 'S(0), B', got {type(text).__name__}")
    body = text.strip()
    if body.startswith("(") and _encloses(body):  # "(S(0), B)" as fmt_sbp prints it, not "(S(0))..."
        body = body[1:-1]
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    out: list[SbpParallel] = []
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if not m or m.end() == pos:
            raise SbpError(
                f"cannot parse SBP {text!r} at {body[pos:]!r}; write entries like S(0), B, P, P(max)"
            )
        tok = m.group(1).replace(" ", "")
        if tok.startswith("S"):
            out.append(Split(int(m.group(2)), int(m.group(3) or 1)))
        elif tok == "B":
            out.append(B)
        else:
            out.append(Partial(m.group(4) or "sum"))
        pos = m.end()
    if not out:
        raise SbpError(f"empty SBP string {text!r}")
    return tuple(out)


def as_nd_sbp(sbp: str | SbpParallel | Iterable[SbpParallel], mesh_ndim: int,
              tensor_ndim: int | None = None, what: str = "tensor") -> NdSbp:
    """Normalise user input to an n-D SBP tuple of length ``mesh_ndim``.

    A single SBP on a 1-D mesh is accepted; split dims are normalised and range-checked against
    ``tensor_ndim`` when it is known. Errors name ``what`` (the tensor or op) and what would be valid.
    """
    if isinstance(sbp, str):
        nd = parse_sbp(sbp)
    elif isinstance(sbp, (Split, Broadcast, Partial)):
        nd = (sbp,)
    elif isinstance(sbp, Iterable):
        nd = tuple(sbp)
    else:
        raise InputTypeError(f"{what}: sbp={sbp!r} is not an SBP; give one per mesh axis, like 'S(0), B' "
                             f"or (sl.S(0), sl.B)")
    for x in nd:
        if not isinstance(x, (Split, Broadcast, Partial)):
            raise InputTypeError(f"{what}: {x!r} is not an SBP; use sl.S(i), sl.B or sl.P")
    if len(nd) != mesh_ndim:
        raise SbpError(
            f"{what}: SBP {fmt_sbp(nd)} has {len(nd)} entries but the placement's mesh has "
            f"{mesh_ndim} axes; give exactly one SBP per mesh axis"
        )
    if tensor_ndim is not None:
        nd = tuple(normalize_split(x, tensor_ndim, what) for x in nd)
    return nd


def normalize_split(x: SbpParallel, tensor_ndim: int, what: str = "tensor") -> SbpParallel:
    if not isinstance(x, Split):
        return x
    d = x.dim + tensor_ndim if x.dim < 0 else x.dim
    if tensor_ndim == 0:
        raise SbpError(f"{what}: {x!r} splits a 0-D tensor (a scalar), which has no dim to split; use B or P")
    if not 0 <= d < tensor_ndim:
        raise SbpError(
            f"{what}: S({x.dim}) is out of range for a {tensor_ndim}-D tensor; "
            f"valid split dims are 0..{tensor_ndim - 1} (or -{tensor_ndim}..-1)"
        )
    return x if d == x.dim else Split(d, x.chunks)


def fmt_sbp(nd: Sequence[SbpParallel] | SbpParallel) -> str:
    """``(S(0), B)`` for tuples, ``S(0)`` for a single entry."""
    if isinstance(nd, (Split, Broadcast, Partial)):
        return repr(nd)
    entries = tuple(nd) if isinstance(nd, Iterable) and not isinstance(nd, str) else (nd,)
    if not all(isinstance(x, (Split, Broadcast, Partial)) for x in entries):
        raise InputTypeError(f"fmt_sbp needs an SBP or a tuple of them (sl.S(i), sl.B, sl.P), got {nd!r}")
    return "(" + ", ".join(repr(x) for x in entries) + ")"


def is_partial(x: SbpParallel) -> bool:
    return isinstance(x, Partial)


def is_split(x: SbpParallel) -> bool:
    return isinstance(x, Split)


def is_chunked(x: SbpParallel) -> bool:
    """A strided split ``S(dim, chunks=k)`` with k > 1."""
    return isinstance(x, Split) and x.chunks > 1
