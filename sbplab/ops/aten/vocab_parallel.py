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
