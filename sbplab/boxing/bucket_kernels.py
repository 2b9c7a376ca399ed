"""Pack and unpack a gradient bucket: many reductions of one group done as one collective.

DDP and FSDP coalesce gradients into buckets because every collective pays a fixed latency (and, in
sbplab, a scheduler hop per firing): one all-reduce over a flat buffer of 25 MiB costs about the
same bytes as fifty small ones and a fiftieth of their latency. A bucket is three actors on each
rank: ``pack_bucket`` copies its gradients into one flat buffer when the last of them exists, one
plain collective runs on that buffer, and ``unpack_bucket`` hands each gradient back as a view.

An all-reduce bucket is the flat concatenation. When the plan gives the bucket a buffer that lives
for the whole run (``runtime.buffers``), ``pack_bucket.into`` fills it, and the gradients whose
producers already wrote into their views of it (``attrs["in_place"]``, DDP's
``gradient_as_bucket_view``) are not copied at all. A reduce-scatter bucket must give every rank its own
slice of every gradient, so the buffer is ``p`` equal regions: region ``j`` holds piece ``j`` of each
gradient (split along that gradient's own dim, uneven pieces allowed), zero-padded to the largest
region; a reduce-scatter over dim 0 then leaves region ``me`` on rank ``me``.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..layout import numel


def pack_bucket(xs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor]:
    """The bucket's flat buffer: ``(N,)`` for an all-reduce, ``(p * region,)`` for a reduce-scatter."""
    if "region" not in attrs:  # without the run's buffer (``into``) every gradient is copied
        return (torch.cat([x.reshape(-1) for x in xs]),)
    region, p = attrs["region"], len(attrs["sizes"][0])
    out = torch.zeros(p * region, dtype=xs[0].dtype, device=xs[0].device)
    for j in range(p):
        at = j * region
        for x, dim, sizes in zip(xs, attrs["dims"], attrs["sizes"]):
            piece = x.narrow(dim, sum(sizes[:j]), sizes[j])  # gradient i's piece for rank j
            out[at: at + piece.numel()] = piece.reshape(-1)
            at += piece.numel()
    return (out,)


def _pack_into(xs: list[torch.Tensor], attrs: dict, out: torch.Tensor) -> None:
    """The flat layout in the run's buffer ``out`` ``(N,)``: only gradients not already in place move."""
    for x, at, done in zip(xs, attrs["offsets"], attrs["in_place"]):
        if not done:
            out[at: at + x.numel()].copy_(x.reshape(-1))


def _pack_moved(in_bytes: list[int], attrs: dict) -> int | None:
    """Bytes a pack into the run's buffer moves (the simulator's memory term): each gradient copied is
    read and written, one already in place costs nothing. None: a fresh buffer, inputs plus output."""
    if "in_place" not in attrs:
        return None
    return 2 * sum(b for b, done in zip(in_bytes, attrs["in_place"]) if not done)


pack_bucket.into = _pack_into  # type: ignore[attr-defined]
pack_bucket.moved_bytes = _pack_moved  # type: ignore[attr-defined]


def unpack_bucket(xs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Each gradient of the bucket as a view of the reduced buffer, in its local shape: one
    ``as_strided`` per gradient (half the time of a split and a view each; this runs every step)."""
    flat = xs[0].reshape(-1)
    if flat.stride(0) != 1:  # not a plain buffer: made one (a copy), as reshape would have
        flat = flat.contiguous()
    at, out = flat.storage_offset(), []
    for s in attrs["shapes"]:
        shape, strides = _layout(tuple(s))
        out.append(flat.as_strided(shape, strides, at))
        at += numel(shape)
    return tuple(out)


@lru_cache(maxsize=4096)
def _layout(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` and its contiguous strides."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return shape, tuple(reversed(strides))


unpack_bucket.moved_bytes = lambda in_bytes, attrs: 0  # type: ignore[attr-defined]  # views: nothing moves
