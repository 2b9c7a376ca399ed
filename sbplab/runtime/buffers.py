"""Shared flat buffers that actors write their outputs into (DDP's ``gradient_as_bucket_view``).

A gradient bucket runs one collective on a flat buffer. Packing copies every gradient into it; instead,
the kernels that produce the gradients can write straight into views of a buffer that lives for the
whole run, so packing moves nothing. An actor's ``into`` (a ``BufferSlot``) says which part of which
buffer its one output is.

A buffer is reused every firing, so its reuse must wait until nothing still reads the last values it
held. A pool therefore holds as many buffers as its guard actor (``pool``, the bucket's unpack) has
registers: output ``o`` of every actor writing into the pool lives in buffer ``o % count``, and the
firing rule (``firing.py``) lets such a firing start only once the guard has released output
``o - count``, the last one that used the same buffer. The guard's outputs are the views its
consumers read, released when every consumer has acked them, so every reader is done by then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BufferSlot:
    """Where an actor's one output goes: ``shape`` elements from ``offset`` of the pool ``pool``.

    pool: the name of the actor (on the same rank) whose registers guard the buffers; the pool holds
        one buffer per register of that actor.
    offset: the first element of the view in the flat buffer.
    shape: the output's local shape (the view is contiguous).
    dtype: the buffer's element type (every slot of one pool has the same).
    """

    pool: str
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if not isinstance(self.pool, str) or not self.pool:
            raise ValueError(f"BufferSlot.pool must name the guarding actor, got {self.pool!r}")
        if self.offset < 0:
            raise ValueError(f"BufferSlot({self.pool!r}).offset must be >= 0, got {self.offset}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def end(self) -> int:
        return self.offset + math.prod(self.shape)


class BufferPools:
    """One rank's pools for one run: per pool name, ``count`` flat buffers, made once and reused."""

    def __init__(self, slots: Sequence[BufferSlot], counts: dict[str, int], device: torch.device) -> None:
        sizes: dict[str, tuple[int, torch.dtype]] = {}
        for s in slots:
            n, dtype = sizes.get(s.pool, (0, s.dtype))
            if dtype != s.dtype:
                raise ValueError(f"buffer pool {s.pool!r} mixes dtypes {dtype} and {s.dtype}")
            sizes[s.pool] = (max(n, s.end), dtype)
        # zeros, not empty: padding between slots (if any) must not carry NaNs into a reduction
        self.buffers = {name: [torch.zeros(n, dtype=dtype, device=device) for _ in range(counts[name])]
                        for name, (n, dtype) in sizes.items()}

    def views(self, slot: BufferSlot) -> list[torch.Tensor]:
        """The slot's view in each buffer of its pool (output ``o`` uses entry ``o % len``)."""
        return [b[slot.offset: slot.end].view(slot.shape) for b in self.buffers[slot.pool]]
