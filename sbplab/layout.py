"""Which block of a tensor each rank holds: balanced splits, local shapes, shard and assemble.

These few functions are the single source of truth for SBP layout; the eager tensors, the boxing
executor, the op checker and the pictures all call them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import torch

from .errors import InputError, SbplabError
from .placement import Placement
from .sbp import Broadcast, NdSbp, Partial, SbpParallel, Split, as_nd_sbp, fmt_sbp

Block = tuple[tuple[int, int], ...]  # per tensor dim: [start, stop)


def numel(shape: Sequence[int]) -> int:
    """Elements in a tensor of ``shape`` (1 for a scalar), without making the tensor."""
    n = 1
    for s in shape:
        n *= s
    return n


def balanced_sizes(n: int, parts: int) -> list[int]:
    """OneFlow's balanced splitter: the first ``n % parts`` parts get one element more."""
    if parts < 1 or n < 0:
        raise InputError(f"balanced_sizes: {n} elements into {parts} parts; needs n >= 0 and parts >= 1")
    q, r = divmod(n, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of piece ``index`` when ``n`` elements are split into ``parts``."""
    if not 0 <= index < parts:
        raise InputError(f"split_range: piece {index} of {parts}; needs 0 <= index < parts")
    q, r = divmod(n, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


class LayoutError(SbplabError, ValueError):
    """A tensor cannot have this SBP on this placement (e.g. a dim smaller than its parts)."""


def partial_ok(x: SbpParallel, dtype: torch.dtype) -> bool:
    """Whether a tensor of ``dtype`` can hold ``x``'s partial values: bool tensors cannot be partial
    (a sum of bools is not a bool, and torch's "max" of bools is an or that no collective runs);
    complex ones have P but no P(max)/P(min) (complex numbers are not ordered)."""
    if not isinstance(x, Partial):
        return True
    if dtype == torch.bool:
        return False
    return x.op == "sum" or not dtype.is_complex


def check_layout(shape: Sequence[int], placement: Placement, nd_sbp: NdSbp,
                 what: str = "tensor", dtype: torch.dtype | None = None) -> None:
    """Raise a LayoutError naming ``what`` if some split leaves a rank with an empty piece (or, given
    ``dtype``, if the tensor cannot hold a partial of that kind)."""
    if len(nd_sbp) != placement.ndim:
        raise LayoutError(
            f"{what}: SBP {fmt_sbp(nd_sbp)} has {len(nd_sbp)} entries for a {placement.ndim}-D mesh"
        )
    bad = next((x for x in nd_sbp if dtype is not None and not partial_ok(x, dtype)), None)
    if bad is not None:
        why = "a bool tensor cannot be partial (convert it to an int dtype first)" if dtype == torch.bool else \
            f"{str(dtype).removeprefix('torch.')} values are not ordered, so they have no {bad!r} (P is fine)"
        raise LayoutError(f"{what}: SBP {fmt_sbp(nd_sbp)} has {bad!r}, but {why}; use B or S(i) instead")
    sizes = list(shape)
    # the smallest piece a dim reaches is the last piece at every level; balanced splits keep
    # every piece >= floor(n/p), so checking the floor chain is exact.
    for axis, x in enumerate(nd_sbp):
        if isinstance(x, Split):
            if x.dim >= len(shape) or x.dim < 0:
                raise LayoutError(
                    f"{what}: {x} on mesh axis {axis} does not fit a {len(shape)}-D tensor "
                    f"of shape {tuple(shape)}; valid dims are 0..{len(shape) - 1}"
                )
            parts = placement.shape[axis]
            if x.chunks > 1:
                _check_chunked(shape, nd_sbp, axis, x, parts, what)
                sizes[x.dim] = shape[x.dim] // x.chunks  # each chunk is split: its size is what must divide
            if sizes[x.dim] < parts:
                raise LayoutError(
                    f"{what}: dim {x.dim} has {sizes[x.dim]} elements at mesh axis {axis} "
                    f"(shape {tuple(shape)}, SBP {fmt_sbp(nd_sbp)}) but must be split into {parts} "
                    f"parts; empty shards are not allowed, so use B or split a larger dim"
                )
            sizes[x.dim] //= parts


def _check_chunked(shape: Sequence[int], nd_sbp: NdSbp, axis: int, x: Split, parts: int, what: str) -> None:
    """A strided split ``S(d, chunks=k)``: d holds k equal chunks, and no other mesh axis splits d (the
    chunks of a piece are not a piece of the chunks)."""
    n = shape[x.dim]
    if n % x.chunks:
        raise LayoutError(f"{what}: {x} on mesh axis {axis} needs dim {x.dim} ({n} elements, shape {tuple(shape)}) "
                          f"to hold {x.chunks} equal chunks; use a chunk count that divides {n}, or S({x.dim})")
    other = [a for a, y in enumerate(nd_sbp) if a != axis and isinstance(y, Split) and y.dim == x.dim]
    if other:
        raise LayoutError(f"{what}: {fmt_sbp(nd_sbp)} splits dim {x.dim} on mesh axes {axis} and {other[0]}, but a "
                          f"strided split {x} must be the only split of its dim; split another dim on the other axis")


def local_block(shape: Sequence[int], placement: Placement, nd_sbp: NdSbp, rank: int) -> Block:
    """The global index ranges rank ``rank`` holds (mesh axis 0 splits first)."""
    if type(nd_sbp) is not tuple or len(nd_sbp) != placement.ndim:  # text, lists, a wrong length: checked
        nd_sbp = as_nd_sbp(nd_sbp, placement.ndim, len(shape), what="local_block")
    if type(shape) is tuple and all(type(n) is int for n in shape):
        try:
            return _cached_block(shape, placement, nd_sbp, rank)
        except TypeError:  # something unhashable in the SBP: computed as before (and failing as before)
            pass
    return _block(shape, placement, nd_sbp, rank)


@lru_cache(maxsize=8192)
def _cached_block(shape: tuple[int, ...], placement: Placement, nd_sbp: NdSbp, rank: int) -> Block:
    """``_block`` for plain int shapes: a compile asks for the same few thousand blocks tens of
    thousands of times (every layer, every rank, every pass). Other shapes (numpy ints, sizes) are
    computed each time, so a block always holds the kind of numbers its shape did."""
    return _block(shape, placement, nd_sbp, rank)


def _block(shape: Sequence[int], placement: Placement, nd_sbp: NdSbp, rank: int) -> Block:
    coords = placement.coords(rank)
    block = tuple((0, n) for n in shape)
    for axis, x in enumerate(nd_sbp):
        block = _narrow(block, x, placement.shape[axis], coords[axis])
    return block


def _narrow(block: Block, x: SbpParallel, parts: int, index: int) -> Block:
    """The part of ``block`` that place ``index`` of a mesh axis of ``parts`` places holds under ``x``.

    A strided split's piece (``S(d, chunks=k)``: a slice of each of k chunks) is no range of the dim; its
    block is the range the piece takes once the dim is reordered rank by rank (``[k*a, k*b)``, a the
    piece's start in one chunk): the right sizes, and a position only ``shard``/``assemble`` interpret."""
    if not isinstance(x, Split):
        return block
    s, e = block[x.dim]
    if x.chunks > 1:
        a, b = split_range((e - s) // x.chunks, parts, index)
        return block[:x.dim] + ((s + x.chunks * a, s + x.chunks * b),) + block[x.dim + 1:]
    a, b = split_range(e - s, parts, index)
    return block[:x.dim] + ((s + a, s + b),) + block[x.dim + 1:]


def take_piece(t: torch.Tensor, x: Split, parts: int, index: int) -> torch.Tensor:
    """Piece ``index`` of ``parts`` of ``t`` under split ``x`` (for a strided split: that piece of every chunk,
    in chunk order)."""
    if x.chunks == 1:
        a, b = split_range(t.shape[x.dim], parts, index)
        return t.narrow(x.dim, a, b - a)
    c = t.shape[x.dim] // x.chunks
    a, b = split_range(c, parts, index)
    return torch.cat([t.narrow(x.dim, j * c + a, b - a) for j in range(x.chunks)], dim=x.dim)


def join_pieces(pieces: Sequence[torch.Tensor], x: Split) -> torch.Tensor:
    """The inverse of ``take_piece`` over all the pieces of an axis, in order."""
    if x.chunks == 1:
        return torch.cat(list(pieces), dim=x.dim)
    per = [p.chunk(x.chunks, dim=x.dim) if p.shape[x.dim] else [p] * x.chunks for p in pieces]
    return torch.cat([per[r][j] for j in range(x.chunks) for r in range(len(pieces))], dim=x.dim)


def _chunked(nd_sbp: NdSbp) -> bool:
    return any(isinstance(x, Split) and x.chunks > 1 for x in nd_sbp)


def local_piece(full: torch.Tensor, placement: Placement, nd_sbp: NdSbp, rank: int) -> torch.Tensor:
    """Rank ``rank``'s piece of ``full`` (partial axes ignored: the value itself), nested mesh axis 0 first."""
    coords, piece = placement.coords(rank), full
    for axis, x in enumerate(nd_sbp):
        if isinstance(x, Split):
            piece = take_piece(piece, x, placement.shape[axis], coords[axis])
    return piece


def mesh_blocks(shape: Sequence[int], mesh_shape: Sequence[int], nd_sbp: NdSbp) -> list[Block]:
    """Every rank's ``local_block`` on a mesh of this shape at once, ranks in row-major order."""
    every = [tuple((0, n) for n in shape)]
    for axis, x in enumerate(nd_sbp):
        p = mesh_shape[axis]
        every = [_narrow(blk, x, p, c) for blk in every for c in range(p)]
    return every


def local_shape(shape: Sequence[int], placement: Placement, nd_sbp: NdSbp, rank: int) -> tuple[int, ...]:
    return tuple(e - s for s, e in local_block(shape, placement, nd_sbp, rank))


def block_slices(block: Block) -> tuple[slice, ...]:
    return tuple(slice(s, e) for s, e in block)


def partial_fill(op: str, like: torch.Tensor) -> torch.Tensor:
    """The identity of a reduce op: 0 for sum, -inf/+inf (or the int extremes) for max/min."""
    if op == "sum":
        return torch.zeros_like(like)
    if like.dtype.is_floating_point:
        v = float("-inf") if op == "max" else float("inf")
    else:
        info = torch.iinfo(like.dtype)
        v = info.min if op == "max" else info.max
    return torch.full_like(like, v)


def holds_value(placement: Placement, nd_sbp: NdSbp, rank: int) -> bool:
    """Under ``P`` only coordinate 0 of each partial-sum axis keeps the value; the rest hold zeros."""
    coords = placement.coords(rank)
    return all(coords[a] == 0 for a, x in enumerate(nd_sbp) if isinstance(x, Partial) and x.op == "sum")


def shard(full: torch.Tensor, placement: Placement, nd_sbp: NdSbp, what: str = "tensor") -> dict[int, torch.Tensor]:
    """Cut a full value into one local tensor per rank (P: rank 0 keeps it, the others get zeros)."""
    nd_sbp = as_nd_sbp(nd_sbp, placement.ndim, full.ndim, what)
    check_layout(full.shape, placement, nd_sbp, what, full.dtype)
    out: dict[int, torch.Tensor] = {}
    chunked = _chunked(nd_sbp)
    for rank in placement.rank_list:
        piece = local_piece(full, placement, nd_sbp, rank).clone() if chunked else \
            full[block_slices(local_block(full.shape, placement, nd_sbp, rank))].clone()
        if not holds_value(placement, nd_sbp, rank):
            piece = torch.zeros_like(piece)
        out[rank] = piece
    return out


def reduce_tensors(op: str, xs: Sequence[torch.Tensor]) -> torch.Tensor:
    out = xs[0].clone()
    for x in xs[1:]:
        if op == "sum":
            out = out + x
        elif op == "max":
            out = torch.maximum(out, x)
        else:
            out = torch.minimum(out, x)
    return out


def assemble(shards: Mapping[int, torch.Tensor], placement: Placement, nd_sbp: NdSbp) -> torch.Tensor:
    """The full value of a sharded tensor: reduce partial axes, concatenate split axes.

    Works from the last mesh axis back to the first, so each level rebuilds the piece its parent
    axis left, which is exactly the nested meaning of n-D SBP.
    """
    if type(nd_sbp) is not tuple or len(nd_sbp) != placement.ndim:
        nd_sbp = as_nd_sbp(nd_sbp, placement.ndim, what="assemble")
    if len(shards) != placement.size or any(r not in shards for r in placement.rank_list):
        raise InputError(f"assemble needs one shard per rank of {placement}: ranks {list(placement.rank_list)}, "
                         f"got {list(shards)}")
    level: dict[tuple[int, ...], torch.Tensor] = {placement.coords(r): t for r, t in shards.items()}
    for axis in reversed(range(placement.ndim)):
        x = nd_sbp[axis]
        parents: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for c in sorted(level):
            parents.setdefault(c[:axis], []).append(level[c])
        if isinstance(x, Split):
            level = {k: join_pieces(v, x) for k, v in parents.items()}
        elif isinstance(x, Broadcast):
            level = {k: v[0] for k, v in parents.items()}
        else:
            level = {k: reduce_tensors(x.op, v) for k, v in parents.items()}
    return level[()]


def random_shards(full: torch.Tensor, placement: Placement, nd_sbp: NdSbp,
                  generator: torch.Generator | None = None) -> dict[int, torch.Tensor]:
    """Shards of ``full`` with honest partial values: random addends (P) or candidates (P(max/min)).

    ``shard`` gives rank 0 the value and zeros elsewhere, so a reduction that just took the first
    shard would pass on it; tests of collectives and kernels use these instead. Built in the nested
    order of n-D SBP (mesh axis 0 first), copies identical along broadcast axes, each element of a
    max/min won by a random rank. The noise is integer-valued, so sums stay exact.
    """
    nd_sbp = as_nd_sbp(nd_sbp, placement.ndim, full.ndim, what="random_shards")
    check_layout(full.shape, placement, nd_sbp, "random_shards", full.dtype)
    g = generator if generator is not None else torch.Generator().manual_seed(0)

    def noise(like: torch.Tensor, low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high, like.shape, generator=g).to(like.dtype)

    def build(piece: torch.Tensor, axis: int) -> dict[tuple[int, ...], torch.Tensor]:
        if axis == placement.ndim:
            return {(): piece.clone()}
        p, x = placement.shape[axis], nd_sbp[axis]
        if isinstance(x, Broadcast):
            sub = build(piece, axis + 1)  # one draw, copied to every coordinate of the axis
            parts = [sub] * p
        elif isinstance(x, Split):
            parts = [build(take_piece(piece, x, p, i), axis + 1) for i in range(p)]
        elif x.op == "sum":
            addends = [noise(piece, -4, 5) for _ in range(p - 1)]
            first = piece - sum(addends) if addends else piece
            parts = [build(t, axis + 1) for t in [first, *addends]]
        else:  # max/min: every candidate is beaten by (or equal to) the value, one random rank equals it
            winner = torch.randint(0, p, piece.shape, generator=g)
            sign = -1 if x.op == "max" else 1
            parts = [build(torch.where(winner == i, piece, piece + sign * noise(piece, 1, 4)), axis + 1)
                     for i in range(p)]
        return {(i, *k): v for i, sub in enumerate(parts) for k, v in sub.items()}

    by_coord = build(full, 0)
    return {r: by_coord[placement.coords(r)].clone() for r in placement.rank_list}
