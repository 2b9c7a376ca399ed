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

A row whose target is ``ignore_index`` has loss 0 and gradient 0, as torch's. ``fused_cross_entropy`` is
``F.cross_entropy`` written so; ``PlainCrossEntropy`` is the torch-function mode under which a trace (the
capture, eager ``sl.apply``) records it for every plain ``F.cross_entropy`` call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

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


REDUCTIONS = ("mean", "sum", "none")


def _plain(args: tuple, kwargs: dict) -> bool:
    """Whether a ``F.cross_entropy`` call is a plain one: class indices, classes in dim 1 of 2-D logits, no class
    weights, no label smoothing (the calls both forms, this one and the vocabulary-sharded one, compute exactly)."""
    names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
    call = dict(zip(names, args)) | kwargs
    x, t = call.get("input"), call.get("target")
    if not isinstance(x, torch.Tensor) or not isinstance(t, torch.Tensor):
        return False
    return (x.dim() == 2 and x.dtype.is_floating_point and t.dim() == 1 and not t.dtype.is_floating_point
            and call.get("weight") is None and call.get("size_average") is None and call.get("reduce") is None
            and call.get("reduction", "mean") in REDUCTIONS and not call.get("label_smoothing", 0.0)
            and isinstance(call.get("ignore_index", -100), int))


def reduce_rows(loss: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    """Per-row losses (N,) reduced as torch's ``reduction``; the mean is over the targets not ignored (nan
    when there are none, as torch's)."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum()


def fp32_under_autocast(input: torch.Tensor) -> torch.Tensor:
    if input.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(input.device.type):
        return input.float()  # autocast runs torch's cross entropy in fp32: so does this one
    return input


def fused_cross_entropy(input: torch.Tensor, target: torch.Tensor, weight=None, size_average=None,  # noqa: A002
                        ignore_index: int = -100, reduce=None, reduction: str = "mean",
                        label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy(input (N, V), target (N,))`` by rows, with the fused backward."""
    valid = (target != ignore_index).to(input.dtype)  # (N,)
    return reduce_rows(cross_entropy_rows(fp32_under_autocast(input), target, ignore_index), valid, reduction)


class PlainCrossEntropy(TorchFunctionMode):
    """While active, plain ``F.cross_entropy`` calls run ``form``: ``fused_cross_entropy`` or the capture's form for
    vocabulary shards (``compiler/frontend/vocab_cross_entropy.py``); a trace then holds it."""

    def __init__(self, form: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.form = form

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.cross_entropy and _plain(args, kwargs):
            return self.form(*args, **kwargs)
        return func(*args, **kwargs)
