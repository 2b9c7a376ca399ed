"""The vocabulary-parallel embedding of a captured model (Megatron's VocabParallelEmbedding at ATen level).

``aten.embedding(weight (V, C), ids)`` with the weight split by rows (``S(0)``) and the ids whole makes
a partial sum: each rank looks up the ids that fall in its rows and writes zeros for the rest, so the
sum over ranks is the full lookup. ``embedding_dense_backward(grad, ids, V, ...)`` with everything whole
makes each rank's rows of the weight gradient (``B, B -> S(0)``), the ids outside them dropped. Neither
is the ATen op on a shard (it would read out of range), so the rules' ``localize`` swaps each for the
masked op below, with the rank's first row; a rank holding every row keeps the ATen op.

Workers import this module by name (``lib`` in the op's arguments) when they meet the op.
"""

from __future__ import annotations

import torch

from ..registry import LocalContext
from ._common import B, P, S, sig

LIB = __name__


@torch.library.custom_op("sbplab::embedding_rows", mutates_args=())
def embedding_rows(weight: torch.Tensor, indices: torch.Tensor, padding_idx: int = -1,
                   scale_grad_by_freq: bool = False, sparse: bool = False, vocab_start: int = 0) -> torch.Tensor:
    """``weight[indices - vocab_start]`` for the ids in this rank's rows, zeros for the others."""
    mine = (indices >= vocab_start) & (indices < vocab_start + weight.shape[0])
    out = torch.nn.functional.embedding(torch.where(mine, indices - vocab_start, 0), weight)
    return torch.where(mine.unsqueeze(-1), out, torch.zeros((), dtype=out.dtype, device=out.device))


@embedding_rows.register_fake
def _(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False, vocab_start=0):
    return weight.new_empty((*indices.shape, weight.shape[1]))


@torch.library.custom_op("sbplab::embedding_rows_backward", mutates_args=())
def embedding_rows_backward(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int,
                            scale_grad_by_freq: bool, vocab_start: int = 0) -> torch.Tensor:
    """Rows ``[vocab_start, vocab_start + num_weights)`` of the embedding's weight gradient."""
    flat, g = indices.reshape(-1), grad_output.reshape(-1, grad_output.shape[-1])
    keep = (flat >= vocab_start) & (flat < vocab_start + num_weights)
    if padding_idx >= 0:
        keep &= flat != padding_idx
    out = g.new_zeros((num_weights, g.shape[-1]))
    return out.index_add_(0, flat[keep] - vocab_start, g[keep])


@embedding_rows_backward.register_fake
def _(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq, vocab_start=0):
    return grad_output.new_empty((num_weights, grad_output.shape[-1]))


def _with_kwarg(attrs: dict, op: str, args: tuple, start: int) -> dict:
    kwargs = tuple((k, v) for k, v in attrs.get("kwargs", ()) if k != "vocab_start") + (("vocab_start", start),)
    return {**attrs, "op": op, "lib": LIB, "args": args, "kwargs": kwargs}


def embedding_localize(name: str):
    """``aten.embedding`` on a rank holding rows ``[r0, r1)`` of the weight: the masked lookup."""
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        (r0, r1), _ = ctx.in_blocks[0]
        if (r0, r1) == (0, ctx.in_metas[0].shape[0]):
            return attrs
        return _with_kwarg(attrs, "sbplab.embedding_rows.default", tuple(attrs["args"]), r0)
    return localize


def embedding_backward_localize(name: str):
    """``embedding_dense_backward`` making rows ``[r0, r1)`` of the gradient: only those ids' rows."""
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        (r0, r1), _ = ctx.out_blocks[0]
        if (r0, r1) == (0, ctx.out_metas[0].shape[0]):
            return attrs
        args = list(attrs["args"])
        args[2] = r1 - r0  # num_weights: this rank's rows
        return _with_kwarg(attrs, "sbplab.embedding_rows_backward.default", tuple(args), r0)
    return localize


# --- the cross entropy on vocabulary shards (Megatron's vocab_parallel_cross_entropy) ---------------
# ``sbplab.compiler.frontend.vocab_cross_entropy`` writes ``F.cross_entropy`` as a log-sum-exp minus the
# target's logit; the target's logit is the op below. On logits split by vocabulary (``S(-1)``) each rank
# picks the targets in its columns and zeros for the rest (a partial sum), and its backward writes the
# gradient into this rank's columns only: nothing is gathered, forward or backward.

@torch.library.custom_op("sbplab::pick_logit", mutates_args=())
def pick_logit(logits: torch.Tensor, target: torch.Tensor, vocab_start: int = 0) -> torch.Tensor:
    """``logits[..., target - vocab_start]`` (..., V) -> (...) for the targets in these columns, else 0 (an
    ignored target, e.g. -100, is in no rank's columns)."""
    v = logits.shape[-1]
    mine = (target >= vocab_start) & (target < vocab_start + v)
    idx = torch.where(mine, target - vocab_start, 0).unsqueeze(-1)
    out = logits.gather(-1, idx).squeeze(-1)
    return torch.where(mine, out, torch.zeros((), dtype=out.dtype, device=out.device))


@pick_logit.register_fake
def _(logits, target, vocab_start=0):
    return logits.new_empty(logits.shape[:-1])


@torch.library.custom_op("sbplab::pick_logit_backward", mutates_args=())
def pick_logit_backward(grad: torch.Tensor, target: torch.Tensor, num_classes: int,
                        vocab_start: int = 0) -> torch.Tensor:
    """Columns ``[vocab_start, vocab_start + num_classes)`` of ``pick_logit``'s input gradient: ``grad``
    at each target's column, zeros elsewhere."""
    mine = (target >= vocab_start) & (target < vocab_start + num_classes)
    idx = torch.where(mine, target - vocab_start, 0).unsqueeze(-1)
    out = grad.new_zeros((*grad.shape, num_classes))
    src = torch.where(mine, grad, torch.zeros((), dtype=grad.dtype, device=grad.device)).unsqueeze(-1)
    return out.scatter(-1, idx, src)


@pick_logit_backward.register_fake
def _(grad, target, num_classes, vocab_start=0):
    return grad.new_empty((*grad.shape, num_classes))


def _pick_setup(ctx, inputs, output) -> None:
    logits, target, start = inputs
    ctx.save_for_backward(target)
    ctx.num_classes, ctx.vocab_start = logits.shape[-1], start


def _pick_backward(ctx, grad):
    (target,) = ctx.saved_tensors
    return pick_logit_backward(grad, target, ctx.num_classes, ctx.vocab_start), None, None


pick_logit.register_autograd(_pick_backward, setup_context=_pick_setup)


@torch.library.custom_op("sbplab::log_saving_output", mutates_args=())
def log_saving_output(z: torch.Tensor) -> torch.Tensor:
    """``log z`` whose backward reads its output (``1/z = exp(-log z)``), not ``z``: on vocabulary shards ``z``
    (the sum of exponentials) is a partial sum all-reduced forward, and a backward reading it would
    all-reduce it again. A pointwise op for the rules."""
    return torch.log(z)


@log_saving_output.register_fake
def _(z):
    return torch.empty_like(z)


def _log_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)


def _log_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return grad * torch.exp(-out)


log_saving_output.register_autograd(_log_backward, setup_context=_log_setup)


def pick_localize(name: str):
    """``pick_logit`` on a rank holding columns ``[c0, c1)`` of the logits: those columns' targets."""
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        c0, _ = ctx.in_blocks[0][-1]
        args = tuple(attrs["args"])[:2] + (c0,)
        return {**attrs, "args": args, "kwargs": ()}
    return localize


def pick_backward_localize(name: str):
    """``pick_logit_backward`` making columns ``[c0, c1)`` of the gradient."""
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        c0, c1 = ctx.out_blocks[0][-1]
        args = tuple(attrs["args"])[:2] + (c1 - c0, c0)
        return {**attrs, "args": args, "kwargs": ()}
    return localize


def pick_signatures(name: str, ins: list, outs: list, attrs: dict) -> list:
    """logits (..., V), target (...) -> (...): the vocabulary split makes a partial sum; batch dims split
    with the target; linear in the logits."""
    nd = len(ins[0].shape)
    batch = [sig([S(d), S(d)], [S(d)]) for d in range(nd - 1) if ins[0].shape[d] > 1]
    return [sig([S(nd - 1), B], [P]), *batch, sig([P, B], [P])]


def pick_backward_signatures(name: str, ins: list, outs: list, attrs: dict) -> list:
    """grad (...), target (...) -> (..., V): whole inputs make any columns; batch dims split together;
    linear in the gradient."""
    nd = len(outs[0].shape)
    batch = [sig([S(d), S(d)], [S(d)]) for d in range(nd - 1) if outs[0].shape[d] > 1]
    return [sig([B, B], [S(nd - 1)]), *batch, sig([P, B], [P])]
