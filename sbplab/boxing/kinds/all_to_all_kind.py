"""All-to-all on one mesh axis: S(i) -> S(j), every rank sends each other rank the block it will own.

Exactly the blocks that change owner travel (unequal blocks as they are, no padding): rank ``i``
holding ``a[i]`` of dim i and all of dim j sends ``rest * a[i] * (D_j - b[i])`` elements, BRIEF's
``T (p - 1) / p^2`` for even splits.
"""

from __future__ import annotations

import torch

from ...layout import balanced_sizes, local_shape, split_range
from ...sbp import SbpParallel, Split
from .collective_kind import CollectiveKind, even_sizes, numel, rest_of
from .kind_registry import register


class AllToAllKind(CollectiveKind):
    """S(i) -> S(j): exchange blocks so the split moves to dim j."""

    name = "all_to_all"

    def turns(self, old: SbpParallel, new: SbpParallel) -> bool:
        # a strided split's pieces are no ranges of their dim: it goes through B (gather, then slice)
        return isinstance(old, Split) and isinstance(new, Split) and old.dim != new.dim and old.chunks == new.chunks == 1

    def rank_elements(self, piece, old, new, p, i) -> tuple[int, int, int]:
        D, D2 = piece[old.dim], piece[new.dim]
        rest = numel(piece) // (D * D2)
        a, b = balanced_sizes(D, p), balanced_sizes(D2, p)
        s, r = rest * a[i] * (D2 - b[i]), rest * b[i] * (D - a[i])
        return s, r, max(s, r)

    def explain(self, old, new, axis_label: str) -> str:
        return f"{old!r} -> {new!r} on {axis_label}: exchange blocks so the split moves to dim {new.dim}"

    def apply(self, step, group, xs, shape) -> list[torch.Tensor]:
        old, new = step.src_sbp[step.mesh_axis], step.dst_sbp[step.mesh_axis]
        p, n = len(group), xs[0].shape[new.dim]
        out = []
        for j in range(p):  # rank j receives block j of every sender, in sender order
            a, b = split_range(n, p, j)
            out.append(torch.cat([x.narrow(new.dim, a, b - a) for x in xs], dim=old.dim))
        return out

    def collective_attrs(self, step, group, in_shape, shape) -> dict:
        old, new = step.src_sbp[step.mesh_axis], step.dst_sbp[step.mesh_axis]
        return dict(dim=new.dim, cat_dim=old.dim, sizes=tuple(balanced_sizes(in_shape[new.dim], len(group))),
                    cat_sizes=tuple(local_shape(shape, step.placement, step.src_sbp, m)[old.dim] for m in group))

    def actor_bytes(self, actor, me, shape, itemsize) -> int:
        sizes = actor.sizes or even_sizes(shape[actor.dim], len(actor.group), actor.name)
        return (numel(shape) - rest_of(shape, actor.dim) * sizes[me]) * itemsize  # all but my own piece

    def actor_output_shape(self, actor, me, shape) -> tuple[int, ...]:
        p = len(actor.group)
        out = list(shape)
        out[actor.dim] = (actor.sizes or even_sizes(shape[actor.dim], p, actor.name))[me]
        out[actor.cat_dim] = sum(actor.cat_sizes) if actor.cat_sizes else shape[actor.cat_dim] * p
        return tuple(out)

    def launch(self, actor, x, comm, group, p, me, inplace):
        sizes = actor.sizes or even_sizes(x.shape[actor.dim], p, actor.name)
        cat_sizes = actor.cat_sizes or (x.shape[actor.cat_dim],) * p
        flat = [c.contiguous().view(-1) for c in torch.split(x, list(sizes), actor.dim)]
        shapes = []
        for q in range(p):
            s = list(x.shape)
            s[actor.dim], s[actor.cat_dim] = sizes[me], cat_sizes[q]
            shapes.append(s)
        out_splits = [numel(s) for s in shapes]
        out = torch.empty(sum(out_splits), dtype=x.dtype, device=x.device)
        work = comm.all_to_all(out, torch.cat(flat), out_splits, [f.numel() for f in flat], group)

        def finish() -> torch.Tensor:
            return torch.cat([t.view(s) for t, s in zip(torch.split(out, out_splits), shapes)], actor.cat_dim)
        return work, finish


register(AllToAllKind())
