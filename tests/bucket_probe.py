"""A kernel that reports, from inside a worker, where a bucket's gradients live (tests import it there)."""

from __future__ import annotations

import torch


def where_grads_live(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor]:
    """(packed buffer, gradient 0, gradient 1, ...) -> int64 ``(2 + n,)``: the buffer's address, how many
    gradients share its storage, then each gradient's offset in it (in elements; -1 if elsewhere)."""
    buf, grads = inputs[0], inputs[1:]
    base, size = buf.untyped_storage().data_ptr(), buf.element_size()
    offsets = [(g.data_ptr() - buf.data_ptr()) // size
               if g.untyped_storage().data_ptr() == base else -1 for g in grads]
    return (torch.tensor([buf.data_ptr(), sum(o >= 0 for o in offsets), *offsets], dtype=torch.int64),)
