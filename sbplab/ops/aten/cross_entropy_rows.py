"""The cross entropy of each row as one op, whose backward holds one buffer the size of the logits.

torch's ``F.cross_entropy`` is a log-softmax then a pick of each target's log-probability. Its backward,
in the ATen ops a rule can split, is a one-hot gradient (zeros, scatter), a mask, a product and the
log-softmax's backward: three buffers the size of the logits live at once beside the log-probabilities,
and for a language model the logits are the largest activation of the step (16k tokens x 50k classes in
fp32 is 3.3 GB). Fused cross entropies (Megatron's, Liger's) hold the gradient alone: ``softmax(x) -
onehot(target)`` scaled by the row's gradient, made a chunk of rows at a time. The two ops below are
that, as library custom ops that torch's autograd connects, so torch's backward of a cross entropy
written with ``cross_entropy_rows`` is the fused one (bit for bit torch's gradient: each chunk runs
torch's own kernels), and one rule covers both: rows split together (``family_nn.cross_entropy_rows_signatures``).

    rows = cross_entropy_rows(x, target, ignore_index)   # (N, C), (N,) -> (N,)  S(0), S(0) -> S(0)
    loss = rows.sum() / (target != ignore_index).sum()   # torch's mean, over the targets not ignored

A row whose target is ``ignore_index`` has loss 0 and gradient 0, as torch's.
"""

from __future__ import annotations

import torch

LIB = __name__


CHUNK_ELEMENTS = 1 << 24  # rows are worked through in chunks of about this many logits (64 MB in fp32)


def _row_chunks(logits: torch.Tensor) -> list[slice]:
    """Slices of about ``CHUNK_ELEMENTS`` logits each, covering the rows of ``logits`` (N, C)."""
    step = max(1, CHUNK_ELEMENTS // max(1, logits.shape[1]))
    return [slice(r, r + step) for r in range(0, logits.shape[0], step)]


@torch.library.custom_op("sbplab::cross_entropy_rows", mutates_args=())
def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """(N, C) logits, (N,) class indices -> (N,) ``-log_softmax(x)[target]``, 0 where ignored; the
    log-softmax made a chunk of rows at a time, never whole."""
    valid = target != ignore_index
    index = torch.where(valid, target, 0).unsqueeze(1)  # (N, 1)
    out = logits.new_empty(logits.shape[:1])
    for rows in _row_chunks(logits):
        out[rows] = torch.log_softmax(logits[rows], dim=1).gather(1, index[rows]).squeeze(1).neg_()
    return out.masked_fill_(~valid, 0.0)


@cross_entropy_rows.register_fake
def _(logits, target, ignore_index=-100):
    return logits.new_empty(logits.shape[:1])


@torch.library.custom_op("sbplab::cross_entropy_rows_backward", mutates_args=())
def cross_entropy_rows_backward(grad: torch.Tensor, logits: torch.Tensor, target: torch.Tensor,
                                ignore_index: int = -100) -> torch.Tensor:
    """(N,) row gradients -> (N, C) ``(softmax(x) - onehot(target)) * grad``, 0 on ignored rows.

    A chunk of rows at a time, with torch's own kernels (``log_softmax``, the one-hot gradient torch's
    ``nll_loss_backward`` makes, ``_log_softmax_backward_data`` writing straight into the result): the
    gradient is torch's bit for bit, and besides the result only a chunk's two buffers are ever held."""
    valid = target != ignore_index
    index = torch.where(valid, target, 0).unsqueeze(1)  # (N, 1)
    picked = torch.where(valid, grad, torch.zeros((), dtype=grad.dtype, device=grad.device)).to(logits.dtype)
    out = torch.empty_like(logits)  # (N, C)
    for rows in _row_chunks(logits):
        onehot = torch.zeros_like(logits[rows]).scatter_(1, index[rows], picked[rows].neg().unsqueeze(1))
        torch.ops.aten._log_softmax_backward_data.out(onehot, torch.log_softmax(logits[rows], dim=1), 1,
                                                      logits.dtype, out=out[rows])
    return out


@cross_entropy_rows_backward.register_fake
def _(grad, logits, target, ignore_index=-100):
    return torch.empty_like(logits)


def _setup(ctx, inputs, output) -> None:
    logits, target, ignore_index = inputs
    ctx.save_for_backward(logits, target)
    ctx.ignore_index = ignore_index


def _backward(ctx, grad):
    logits, target = ctx.saved_tensors
    return cross_entropy_rows_backward(grad, logits, target, ctx.ignore_index), None, None


cross_entropy_rows.register_autograd(_backward, setup_context=_setup)
