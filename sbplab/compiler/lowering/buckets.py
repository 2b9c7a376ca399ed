"""Gradient buckets: which parameter-gradient reductions of the physical graph run as one collective.

As DDP's Reducer does, gradients are taken in the order backward produces them and packed into
buckets of up to ``cap_bytes`` (DDP's default 25 MiB), one open bucket per group: a bucket only
holds reductions that are the same collective on the same ranks (kind, group, mesh axis, reduce
op, dtype, when). A bucket fires when its last gradient exists, so earlier buckets overlap the rest
of backward. Unlike DDP, a bucket never grows past the cap (a gradient that would overflow it starts
the next one; one larger than the cap goes alone): the last bucket's reduction cannot overlap
anything, so a big gradient joining it would only lengthen the exposed tail. Only parameter
gradients are bucketed: an activation gradient's reduction (Megatron's
"f") is on backward's critical path and must not wait for others.

The physical graph keeps one collective per gradient (what each tensor needs); buckets are how the
actor plan executes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...boxing.kinds import kind_of
from ...layout import numel

if TYPE_CHECKING:
    from ..ir import Graph
    from ..physical.graph import PhysicalGraph



@dataclass(frozen=True)
class Bucket:
    """Reductions ``collectives`` (indices into ``phys.collectives``, in production order) of one group
    that run as one ``kind`` collective over a flat buffer."""

    index: int
    kind: str
    collectives: tuple[int, ...]


def plan_buckets(phys: PhysicalGraph, graph: Graph, cap_bytes: float) -> list[Bucket]:
    """The buckets of ``phys`` (only those with at least two gradients; ``cap_bytes <= 0``: none)."""
    if cap_bytes <= 0:
        return []
    grads = set(graph.grads.values())
    open_: dict[tuple, tuple[list[int], int]] = {}  # key -> (members, bytes so far)
    done: list[tuple[str, list[int]]] = []
    for c in phys.collectives:
        first = phys.nodes[c.nodes[0]]
        if kind_of(c.kind).bucket_layout is None or c.mesh_axis is None or first.logical not in grads:
            continue
        step = first.attrs["plan_step"]
        if getattr(step.dst_sbp[c.mesh_axis], "chunks", 1) > 1:  # a strided reduce-scatter reorders its input
            continue  # first (its pieces are no ranges of the dim): it runs alone
        key = (c.kind, c.group, c.mesh_axis, step.src_sbp[c.mesh_axis].op, first.out_dtypes[0], c.when, first.stage)
        nbytes = numel(first.in_shapes[0]) * first.out_dtypes[0].itemsize
        members, size = open_.get(key, ([], 0))
        if members and size + nbytes > cap_bytes:  # full: it goes out, this gradient starts the next one
            done.append((c.kind, members))
            members, size = [], 0
        open_[key] = (members + [c.index], size + nbytes)
    done += [(key[0], members) for key, (members, _) in open_.items()]
    done.sort(key=lambda km: km[1][-1])  # by when the bucket is ready: its last gradient
    return [Bucket(i, kind, tuple(m)) for i, (kind, m) in enumerate(km for km in done if len(km[1]) > 1)]

