"""``F.cross_entropy`` written so that its logits can stay split over the vocabulary.

torch's cross entropy is a log-softmax over the classes followed by a pick of each target's log-probability;
on logits split by vocabulary (the output layer of Megatron's tensor parallel) neither has a local form,
so the logits were gathered first: (B*T, V) bytes per rank for the largest activation of a language model.
Megatron's vocab-parallel cross entropy needs three all-reduces of (B*T,) numbers instead, and no
communication backward. The capture writes the same loss in ops that say exactly that:

    m   = amax(x, classes).detach()          # (N, 1)   S(V) -> P(max): all-reduce max
    z   = sum(exp(x - m), classes)           # (N,)     S(V) -> P: all-reduce sum
    x_t = sbplab::pick_logit(x, target)      # (N,)     S(V) -> P: all-reduce sum (the target's logit)
    loss_i = (log z + m - x_t) * (target != ignore_index)

The max is only a shift for stability (the loss does not depend on it, so it carries no gradient); the
backward autograd derives is softmax minus the one-hot target, each rank on its own columns. With the logits
whole the ops compute the same loss as torch (to rounding: the gradient is not bit for bit torch's, which
low-precision gradients and optimizer states amplify). So the capture writes it only for a strategy that
splits the vocabulary (``sharded_loss``, set by ``sl.compile``).

Otherwise the capture writes it with ``cross_entropy_rows`` (``ops/aten/cross_entropy_rows.py``): the same
loss as torch's, whose backward is fused (softmax minus the one-hot target, one buffer the size of the
logits rather than torch's three). Only the plain call is rewritten: class indices, classes in dim 1 of
2-D logits, no class weights, no label smoothing; any other call is torch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch.overrides import TorchFunctionMode

from ...ops.aten.cross_entropy_rows import (
    PlainCrossEntropy,
    fp32_under_autocast,
    fused_cross_entropy,
    reduce_rows,
)
from ...ops.aten.vocab_parallel import log_saving_output, pick_logit

_SHARDED: ContextVar[bool] = ContextVar("sbplab_sharded_loss", default=False)


@contextlib.contextmanager
def sharded_loss(on: bool = True) -> Iterator[None]:
    """While active (``on``), the ATen capture writes plain cross entropies for vocabulary shards."""
    token = _SHARDED.set(on)
    try:
        yield
    finally:
        _SHARDED.reset(token)


def splits_vocabulary(strategy) -> bool:
    """Whether ``strategy`` has a tensor-parallel rule that may split the vocabulary."""
    return any(type(r).__name__ == "TensorParallel" and r.vocab is not False for r in getattr(strategy, "rules", ()))


def capture_mode() -> TorchFunctionMode:
    """What the capture enters: the cross entropy on vocabulary shards when ``sharded_loss`` is on, else the
    fused one."""
    return PlainCrossEntropy(cross_entropy if _SHARDED.get() else fused_cross_entropy)


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight=None, size_average=None,  # noqa: A002
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy(input (N, V), target (N,))`` as a log-sum-exp minus the target's logit."""
    input = fp32_under_autocast(input)
    m = torch.amax(input, dim=1, keepdim=True).detach()  # (N, 1)  a shift: the loss does not depend on it
    z = torch.exp(input - m).sum(dim=1)  # (N,)
    valid = (target != ignore_index).to(input.dtype)  # (N,)
    loss = (log_saving_output(z) + m.squeeze(1) - pick_logit(input, target)) * valid  # (N,)
    return reduce_rows(loss, valid, reduction)
