"""One bucket on one rank as actors: ``pack`` (its gradients into a flat buffer), one collective on
that buffer, and ``unpack`` (a view per gradient). See ``boxing.bucket_kernels`` for the layout.

An all-reduce bucket's pack writes ``into`` a buffer the run keeps (one per register of the unpack,
which guards its reuse); ``bucket_views`` then lets the gradients' producers write there themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...boxing.bucket_kernels import pack_bucket, unpack_bucket
from ...boxing.kinds import kernel_ref, kind_of
from ...boxing.kinds.collective_kind import rest_of
from ...layout import numel
from ...runtime.buffers import BufferSlot
from ...runtime.specs import Actor, Collective, Compute, Ref

if TYPE_CHECKING:
    from ..ir import Graph
    from ..physical.graph import PhysNode
    from .buckets import Bucket


def bucket_actors(b: Bucket, members: list[PhysNode], inputs: list[Ref], graph: Graph,
                  common: dict, cache: dict | None = None) -> list[Actor]:
    """The actors of bucket ``b`` on the rank of ``members`` (its gradient reductions there, in
    bucket order; ``inputs``: the registers they read). ``cache``: the layout of the bucket by its
    group and shapes, which every rank of that group shares (at 64 ranks, each rank computed it again)."""
    kind = kind_of(b.kind)
    group = tuple(members[0].attrs["group"])
    step = members[0].attrs["plan_step"]
    me = group.index(members[0].rank)
    name = f"b{b.index}"
    key = (b.index, group, tuple(m.in_shapes[0] for m in members))
    got = None if cache is None else cache.get(key)
    if got is None:
        got = _layout(kind, members, group, graph)
        if cache is not None:
            cache[key] = got
    pack_attrs, flat, coll, flat_bucket = got
    pack = dict(pack_attrs)  # the pack's own: ``gradients_into_buckets`` marks its in-place members per rank
    into = BufferSlot(f"{name}.unpack", 0, flat, members[0].out_dtypes[0]) if flat_bucket else None
    # A flat bucket's buffers are one per register of its unpack: one, as DDP keeps one bucket. It costs
    # no overlap: the next step's gradients need the parameters this step's update computes from them.
    unpack_common = {**common, "registers": 1} if into is not None else common
    c = Collective(name, kind_=kind.name, group=group, inputs=(Ref(f"{name}.pack"),),
                   order=members[-1].collective or 0, mesh_axis=step.mesh_axis, **coll, **common)
    c.bytes_sent = kind.actor_bytes(c, me, flat, members[0].out_dtypes[0].itemsize)
    return [
        Compute(f"{name}.pack", op=kernel_ref(pack_bucket), attrs=pack, inputs=tuple(inputs), into=into, **common),
        c,
        Compute(f"{name}.unpack", op=kernel_ref(unpack_bucket), attrs=dict(shapes=tuple(m.out_shapes[0] for m in members)),
                inputs=(Ref(name),), outputs=len(members), **unpack_common),
    ]


def _layout(kind, members: list[PhysNode], group: tuple[int, ...], graph: Graph) -> tuple[dict, tuple, dict, bool]:
    """(the pack's attributes, the flat buffer's shape, the collective's fields, whether flat) of a bucket of
    ``members`` reduced over ``group``: the same on every rank of the group with the same shapes."""
    kws = [kind.collective_attrs(m.attrs["plan_step"], group, m.in_shapes[0], graph.tensors[m.logical].shape)
           for m in members]
    p = len(group)
    if kind.bucket_layout == "flat":  # the flat concatenation: (sum of numels,)
        counts = [numel(m.in_shapes[0]) for m in members]
        offsets = tuple(sum(counts[:i]) for i in range(len(members)))
        pack: dict = dict(offsets=offsets, shapes=tuple(tuple(m.in_shapes[0]) for m in members),
                          in_place=(False,) * len(members))
        return pack, (sum(counts),), dict(reduce_op=kws[0]["reduce_op"]), True
    # reduce-scatter: p equal regions, region j = every gradient's piece j
    dims = tuple(kw["dim"] for kw in kws)
    sizes = tuple(tuple(kw["sizes"]) for kw in kws)
    rests = [rest_of(m.in_shapes[0], d) for m, d in zip(members, dims)]  # once per member, not per region
    region = max(sum(r * s[j] for r, s in zip(rests, sizes)) for j in range(p))
    return dict(dims=dims, sizes=sizes, region=region), (p * region,), \
        dict(reduce_op=kws[0]["reduce_op"], dim=0, sizes=(region,) * p), False
