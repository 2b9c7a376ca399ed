"""from_local: a global tensor from the shard each rank holds, checked where a user can get it wrong.

Shards come as a dict rank -> tensor or as a flat list in mesh order (row-major). Each must be a tensor,
all of one dtype, each of exactly the shape the balanced splitter gives its rank, and copies along a
B axis must be equal; every way of missing that has its own message (docs/errors.md lists them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..errors import InputError, InputTypeError
from ..layout import assemble, check_layout, local_shape
from ..placement import Placement
from ..sbp import B, NdSbp, as_nd_sbp, fmt_sbp
from .tensor import GlobalTensor, _fresh_name, need_placement


def from_local(shards: Mapping[int, torch.Tensor] | Sequence[torch.Tensor], placement: Placement, sbp,
               name: str | None = None, *, check: bool = True) -> GlobalTensor:
    """Make a global tensor from its local shards (a dict rank -> tensor, or a flat list in mesh order).

    The logical shape is worked out from the shards; each shard must have exactly the shape the
    balanced splitter gives its rank, and all must share one dtype. ``check`` also compares the copies
    a broadcast axis promises are equal (skip it where they come from a trusted source).
    """
    name = name or _fresh_name()
    need_placement(placement, name)
    order = ("row-major, " if placement.ndim > 1 else "") + f"ranks {list(placement.rank_list)}"
    if isinstance(shards, torch.Tensor) or not isinstance(shards, (Mapping, Sequence)):
        raise InputTypeError(
            f"{name}: from_local takes the local shards, a dict rank -> tensor or a list of {placement.size} "
            f"tensors in mesh order ({order}); got {type(shards).__name__}"
            + (" (for a full value use sl.tensor(full, placement, sbp))" if isinstance(shards, torch.Tensor) else ""))
    if not isinstance(shards, Mapping):
        shards = list(shards)
        for i, t in enumerate(shards):
            if not isinstance(t, torch.Tensor):
                raise InputTypeError(
                    f"{name}: shard {i} of the list is a {type(t).__name__}, not a torch.Tensor; give a flat list of "
                    f"{placement.size} tensors in mesh order ({order}) or a dict rank -> tensor")
        if len(shards) != placement.size:
            raise InputError(f"{name}: {len(shards)} shards for the {placement.size} ranks of {placement}; give "
                             f"one tensor per rank in mesh order ({order}), or a dict rank -> tensor")
        shards = dict(zip(placement.rank_list, shards))
    missing = [r for r in placement.rank_list if r not in shards]
    extra = [r for r in shards if r not in placement]
    if missing or extra:
        raise InputError(f"{name}: the shards are for ranks {list(shards)}, the placement has {order}"
                         + (f"; no shard for {missing}" if missing else "") + (f"; not in it: {extra}" if extra else ""))
    for r, t in shards.items():
        if not isinstance(t, torch.Tensor):
            raise InputTypeError(f"{name}: the shard of rank {r} is a {type(t).__name__}, not a torch.Tensor; give "
                                 f"one tensor per rank (a dict rank -> tensor, or a flat list in mesh order: {order})")
    dtypes = {t.dtype for t in shards.values()}
    if len(dtypes) > 1:
        raise InputError(f"{name}: the shards mix dtypes {({r: t.dtype for r, t in shards.items()})}; every rank "
                         f"must hold the same dtype (convert them with .to(dtype) first)")
    first = next(iter(shards.values()))
    nd = as_nd_sbp(sbp, placement.ndim, first.ndim, what=name)
    metas = {r: torch.empty(t.shape, device="meta") for r, t in shards.items()}
    try:
        shape = tuple(assemble(metas, placement, nd).shape)
    except RuntimeError as e:
        raise InputError(f"{name}: local shapes {({r: tuple(t.shape) for r, t in shards.items()})} do not "
                         f"fit together under SBP {fmt_sbp(nd)}: {e}") from None
    check_layout(shape, placement, nd, name, first.dtype)
    for r, t in shards.items():
        want = local_shape(shape, placement, nd, r)
        if tuple(t.shape) != want:
            raise InputError(
                f"{name}: rank {r} holds a shard of shape {tuple(t.shape)} but a {shape} tensor with SBP "
                f"{fmt_sbp(nd)} gives it {want} (balanced splits: the first n mod p pieces get one more)")
    if check:
        _check_copies(shards, placement, nd, name)
    return GlobalTensor({r: shards[r] for r in placement.rank_list}, placement, nd, shape, name=name)


def _check_copies(shards: Mapping[int, torch.Tensor], placement: Placement, nd: NdSbp, name: str) -> None:
    """Ranks that differ only along a B axis hold copies of one piece: they must be equal."""
    for axis, x in enumerate(nd):
        if x != B:
            continue
        for group in placement.groups(axis):
            a = shards[group[0]]
            for r in group[1:]:
                b = shards[r]
                if not (torch.equal(a, b) or (a.is_floating_point() or a.is_complex())
                        and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())):
                    raise InputError(
                        f"{name}: SBP {fmt_sbp(nd)} is B on mesh axis {axis} ({placement.axis_label(axis)}), so "
                        f"ranks {list(group)} must hold equal copies, but rank {r}'s shard differs from rank "
                        f"{group[0]}'s; use P if they are addends, or S(i) if they are pieces")
