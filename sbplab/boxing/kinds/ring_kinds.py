"""Ring collectives on one mesh axis: all-gather (S -> B), reduce-scatter (P -> S), all-reduce (P -> B).

Bytes are counted per rank for a ring over the group's piece of ``T`` elements:

- all-gather: every rank forwards p - 1 chunks; reduce-scatter, its mirror image, the same;
- all-reduce: a reduce-scatter then an all-gather over a balanced chunking of the flat piece, so
  rank i sends ``2T - c[i] - c[i+1]`` and receives ``2T - c[i-1] - c[i]`` (``c`` = balanced chunks).

Uneven splits (7 rows over 3 ranks) are where the plan, the runtime and the trace used to disagree.
Communicators' all-gather / reduce-scatter take equal pieces (Gloo's and NCCL's do), so the kind pads every piece to the
largest one and the wire really carries ``(p - 1) * max_chunk`` per rank. The plan counts exactly
that (padding in the arithmetic, not unpadded sends in the run): the number the plan reports, the
actor spec's ``bytes_sent`` and the trace's bytes are one number, the one really sent. For even
splits it is BRIEF's ``T (p - 1) / p``. An all-reduce is one torch call on the whole piece, so its
balanced-chunk count holds for every size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...layout import balanced_sizes, join_pieces, local_shape, reduce_tensors, take_piece
from ...sbp import Broadcast, Partial, SbpParallel, Split
from .collective_kind import CollectiveKind, even_sizes, numel, pad0, rest_of
from .kind_registry import register


def split_sizes(n: int, x: Split, p: int) -> list[int]:
    """Each member's size along ``x.dim`` of ``n``: balanced, or under a strided split ``S(d, chunks=k)``
    k times its balanced piece of one chunk (its slice of every chunk)."""
    if x.chunks == 1:
        return balanced_sizes(n, p)
    return [x.chunks * s for s in balanced_sizes(n // x.chunks, p)]


class RingKind(CollectiveKind):
    """A ring collective whose bytes follow from the chunking of the split side."""

    def ring_elements(self, p: int, i: int, T: int, chunks: Sequence[int]) -> tuple[int, int]:
        """(sent, received) elements of member ``i`` over a piece of ``T`` elements in ``chunks``."""
        raise NotImplementedError

    def split_of(self, old: SbpParallel, new: SbpParallel) -> Split:
        """The split side of the step (whose chunks travel)."""
        raise NotImplementedError

    def busy_floor(self, T: int, p: int) -> int:
        """(p - 1) chunks, the largest at least T / p (all-gather and reduce-scatter)."""
        return (p - 1) * T // p

    def rank_elements(self, piece, old, new, p, i) -> tuple[int, int, int]:
        T = numel(piece)
        d = self.split_of(old, new).dim  # the pieces travel whole: a strided split is reordered locally
        rest = rest_of(piece, d)  # once, not once per chunk: pricing asks this for every member of every step
        chunks = [rest * c for c in split_sizes(piece[d], self.split_of(old, new), p)]
        s, r = self.ring_elements(p, i, T, chunks)
        return s, r, max(s, r)


class AllGatherKind(RingKind):
    """S(i) -> B: every rank needs the pieces of the others; pieces padded to the largest."""

    name = "all_gather"

    def turns(self, old: SbpParallel, new: SbpParallel) -> bool:
        return isinstance(old, Split) and isinstance(new, Broadcast)

    def split_of(self, old, new) -> Split:
        return old

    def ring_elements(self, p, i, T, chunks) -> tuple[int, int]:
        n = (p - 1) * max(chunks, default=0)
        return n, n

    def explain(self, old, new, axis_label: str) -> str:
        return f"{old!r} -> B on {axis_label}: every rank needs the pieces of the others"

    def apply(self, step, group, xs, shape) -> list[torch.Tensor]:
        full = join_pieces(xs, step.src_sbp[step.mesh_axis])  # a strided split: chunk by chunk
        return [full.clone() for _ in group]

    def collective_attrs(self, step, group, in_shape, shape) -> dict:
        old = step.src_sbp[step.mesh_axis]
        dim = old.dim
        more = {"chunks": old.chunks} if old.chunks > 1 else {}
        return dict(dim=dim, sizes=tuple(local_shape(shape, step.placement, step.src_sbp, m)[dim] for m in group),
                    **more)

    def actor_bytes(self, actor, me, shape, itemsize) -> int:
        p, D = len(actor.group), shape[actor.dim]
        sizes = actor.sizes or (D,) * p
        rest = rest_of(shape, actor.dim)
        chunks = [rest * s for s in sizes]
        return self.ring_elements(p, me, sum(chunks), chunks)[0] * itemsize

    def actor_output_shape(self, actor, me, shape) -> tuple[int, ...]:
        out = list(shape)
        out[actor.dim] = sum(actor.sizes) if actor.sizes else shape[actor.dim] * len(actor.group)
        return tuple(out)

    def launch(self, actor, x, comm, group, p, me, inplace):
        xt = x.movedim(actor.dim, 0)
        sizes = actor.sizes or (xt.shape[0],) * p
        top = max(sizes)
        out = torch.empty((p * top,) + tuple(xt.shape[1:]), dtype=x.dtype, device=x.device)
        work = comm.all_gather(out, pad0(xt, top), group)

        def finish() -> torch.Tensor:
            pieces = [out[i * top: i * top + s] for i, s in enumerate(sizes)]
            # a strided split: each piece is its slice of k chunks, put back chunk by chunk
            return join_pieces(pieces, Split(0, actor.chunks)).movedim(0, actor.dim).contiguous()
        return work, finish


class ReduceScatterKind(RingKind):
    """P -> S(i): reduce the partial values, each rank keeps its slice; pieces padded to the largest."""

    name = "reduce_scatter"
    reduces = True
    bucket_layout = "regions"

    def turns(self, old: SbpParallel, new: SbpParallel) -> bool:
        return isinstance(old, Partial) and isinstance(new, Split)

    def split_of(self, old, new) -> Split:
        return new

    def ring_elements(self, p, i, T, chunks) -> tuple[int, int]:
        n = (p - 1) * max(chunks, default=0)
        return n, n

    def explain(self, old, new, axis_label: str) -> str:
        return f"{old!r} -> {new!r} on {axis_label}: reduce the partial values, each rank keeps its slice"

    def apply(self, step, group, xs, shape) -> list[torch.Tensor]:
        old, new = step.src_sbp[step.mesh_axis], step.dst_sbp[step.mesh_axis]
        p = len(group)
        return [reduce_tensors(old.op, [take_piece(x, new, p, i) for x in xs]) for i in range(p)]

    def collective_attrs(self, step, group, in_shape, shape) -> dict:
        old, new = step.src_sbp[step.mesh_axis], step.dst_sbp[step.mesh_axis]
        more = {"chunks": new.chunks} if new.chunks > 1 else {}
        return dict(dim=new.dim, reduce_op=old.op, sizes=tuple(split_sizes(in_shape[new.dim], new, len(group))),
                    **more)

    def actor_bytes(self, actor, me, shape, itemsize) -> int:
        p, D = len(actor.group), shape[actor.dim]
        sizes = actor.sizes or even_sizes(D, p, actor.name)
        rest = rest_of(shape, actor.dim)
        chunks = [rest * s for s in sizes]
        return self.ring_elements(p, me, numel(shape), chunks)[0] * itemsize

    def actor_output_shape(self, actor, me, shape) -> tuple[int, ...]:
        out = list(shape)
        out[actor.dim] = (actor.sizes or even_sizes(shape[actor.dim], len(actor.group), actor.name))[me]
        return tuple(out)

    def launch(self, actor, x, comm, group, p, me, inplace):
        xt = x.movedim(actor.dim, 0)
        sizes = actor.sizes or even_sizes(xt.shape[0], p, actor.name)
        top = max(sizes)
        if actor.chunks > 1:  # a strided split: each member's slice of every chunk laid end to end first
            chunks = [take_piece(xt, Split(0, actor.chunks), p, i) for i in range(p)]
        else:
            chunks = torch.split(xt, list(sizes), 0)
        buf = torch.cat([pad0(c, top) for c in chunks], 0) if min(sizes) != top or actor.chunks > 1 else xt.contiguous()
        out = torch.empty((top,) + tuple(xt.shape[1:]), dtype=x.dtype, device=x.device)
        work = comm.reduce_scatter(out, buf, actor.reduce_op, group)
        return work, lambda: out[: sizes[me]].movedim(0, actor.dim).contiguous()


class AllReduceKind(RingKind):
    """P -> B: reduce the partial values everywhere (a reduce-scatter then an all-gather)."""

    name = "all_reduce"
    reduces = True
    bucket_layout = "flat"
    in_place_ok = True
    ring_rounds = 2

    def turns(self, old: SbpParallel, new: SbpParallel) -> bool:
        return isinstance(old, Partial) and isinstance(new, Broadcast)

    def ring_elements(self, p, i, T, chunks) -> tuple[int, int]:
        c = balanced_sizes(T, p)
        return 2 * T - c[i] - c[(i + 1) % p], 2 * T - c[(i - 1) % p] - c[i]

    def rank_elements(self, piece, old, new, p, i) -> tuple[int, int, int]:
        s, r = self.ring_elements(p, i, numel(piece), [])
        return s, r, max(s, r)

    def busy_floor(self, T: int, p: int) -> int:
        """2T less two balanced chunks, each at most ceil(T / p)."""
        return max(0, 2 * T - 2 * -(-T // p))

    def explain(self, old, new, axis_label: str) -> str:
        return f"{old!r} -> B on {axis_label}: reduce the partial values everywhere"

    def apply(self, step, group, xs, shape) -> list[torch.Tensor]:
        total = reduce_tensors(step.src_sbp[step.mesh_axis].op, xs)
        return [total.clone() for _ in group]

    def collective_attrs(self, step, group, in_shape, shape) -> dict:
        return dict(reduce_op=step.src_sbp[step.mesh_axis].op)

    def actor_bytes(self, actor, me, shape, itemsize) -> int:
        return self.ring_elements(len(actor.group), me, numel(shape), [])[0] * itemsize

    def launch(self, actor, x, comm, group, p, me, inplace):
        y = x if inplace and x.is_contiguous() else x.clone()
        work = comm.all_reduce(y, actor.reduce_op, group)
        return work, lambda: y


register(AllGatherKind())
register(ReduceScatterKind())
register(AllReduceKind())
