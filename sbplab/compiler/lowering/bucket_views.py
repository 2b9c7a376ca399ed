"""Gradients written straight into their bucket (DDP's ``gradient_as_bucket_view``).

An all-reduce bucket's pack fills a flat buffer that lives for the whole run (``runtime.buffers``).
Where the producer of a gradient can write its output into a given tensor, it gets that gradient's
view of the buffer as its ``into`` and the pack leaves the gradient where it is: the collective's
input is assembled without a copy. A producer qualifies when

- it is the pack's only reader (another reader would see the value the all-reduce overwrites in
  place), and
- it writes one output per firing of the pack's scope, and its kernel has an ``into`` form
  (``OpDef.kernel_into``); an Accumulate (gradient accumulation) always has one: it sums the
  micro-batches straight into the view.

Others are copied by the pack as before. The buffers' reuse is guarded by the bucket's unpack (the
firing rule, ``runtime.firing``), so a gradient is never overwritten while the collective or a
reader of the reduced values may still need it.
"""

from __future__ import annotations

from collections import Counter

from ...boxing.bucket_kernels import pack_bucket
from ...boxing.kinds import kernel_ref
from ...runtime.actors import resolve_into
from ...runtime.buffers import BufferSlot
from ...runtime.specs import Accumulate, Actor, Compute, Ref

PACK = kernel_ref(pack_bucket)


def _writes_into(prod: Actor, ref: Ref, pack: Compute) -> bool:
    if getattr(prod, "into", None) is not None or prod.out_scope != pack.scope or ref.index != 0:
        return False
    if isinstance(prod, Accumulate):
        return len(prod.inputs) == 1
    return isinstance(prod, Compute) and prod.outputs == 1 and resolve_into(prod.op) is not None


def gradients_into_buckets(actors: list[Actor]) -> list[tuple[Actor, Compute, int]]:
    """Give every qualifying producer of a flat bucket on this rank (``actors``) its view of the bucket's
    buffer, and tell each pack which of its inputs are already in place. Returns (producer, pack, input
    of the pack) of each, so a rank lowered alike (``lowering/grouped.py``) is given the same."""
    packs = [a for a in actors if isinstance(a, Compute) and a.op == PACK and a.into is not None]
    done: list[tuple[Actor, Compute, int]] = []
    if not packs:
        return done
    names = {ref.actor for pack in packs for ref in pack.inputs}  # only the readers of these are counted
    by_name: dict[str, Actor] = {}
    readers: Counter[Ref] = Counter()
    for a in actors:
        if a.name in names:
            by_name[a.name] = a
        for x in a.inputs:
            if x.actor in names:
                readers[x] += 1
        upd = getattr(a, "update", None)
        if upd is not None and upd.actor in names:
            readers[upd] += 1
    for pack in packs:
        slot = pack.into
        assert slot is not None
        flags = list(pack.attrs["in_place"])
        for i, ref in enumerate(pack.inputs):
            prod = by_name[ref.actor]
            if readers[ref] == 1 and _writes_into(prod, ref, pack):
                prod.into = BufferSlot(slot.pool, pack.attrs["offsets"][i], pack.attrs["shapes"][i],  # type: ignore[attr-defined]
                                       slot.dtype)
                flags[i] = True
                done.append((prod, pack, i))
        pack.attrs["in_place"] = tuple(flags)
    return done
