"""Gradient ops of the layers with weights (linear, embedding, conv2d, layer norm) and of the loss.

Their signatures are where data and tensor parallelism meet in the backward pass: a batch-split
gradient times a batch-split input gives a partial-sum (``P``) weight gradient, which the
optimizer's signature later turns into an all-reduce (or a reduce-scatter under ZeRO); a gradient
split over output features gives a weight gradient split the same way as a column-parallel weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sbp import B, P, S
from .grad_ops import _localize_out_shape
from .opkit import check_arity, check_same_shape, define, ew_flops, linear_in, meta_like, numel
from .registry import LocalContext, OpDef, Signature, TensorMeta

# --- linear: y = x @ w.T (+ b), w is (out, in) as in torch ---------------------------------------


def _lgi_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("linear_grad_input", ins, 2)
    g, w = ins
    if len(w.shape) != 2 or g.shape[-1] != w.shape[0]:
        raise ValueError(f"linear_grad_input: gradient {g.shape} does not match weight {w.shape} (out, in)")
    return [TensorMeta(g.shape[:-1] + (w.shape[1],), g.dtype)]


def _lgi_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    last = len(ins[0].shape) - 1
    sigs = [Signature((S(d), B), (S(d),)) for d in range(last)]
    return sigs + [Signature((S(last), S(0)), (P,)), Signature((B, S(1)), (S(last),)),
                   linear_in(2, 1, 0), linear_in(2, 1, 1)]


LINEAR_GRAD_INPUT = define(OpDef(
    "linear_grad_input", _lgi_infer, _lgi_sigs, lambda xs, a: (xs[0] @ xs[1],),
    lambda ins, outs, a: 2 * numel(ins[0].shape) * ins[1].shape[1],
    doc="dx = g @ w for y = x @ w.T; g split over out-features with a row-split weight gives P.",
))


def _lgw_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("linear_grad_weight", ins, 2)
    g, x = ins
    if g.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"linear_grad_weight: gradient {g.shape} and input {x.shape} differ in batch dims")
    return [TensorMeta((g.shape[-1], x.shape[-1]), g.dtype)]


def _lgw_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    last = len(ins[0].shape) - 1
    sigs = [Signature((S(d), S(d)), (P,)) for d in range(last)]
    return sigs + [Signature((S(last), B), (S(0),)), Signature((B, S(last)), (S(1),)),
                   linear_in(2, 1, 0), linear_in(2, 1, 1)]


def _lgw_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    g, x = xs
    return (g.reshape(-1, g.shape[-1]).T @ x.reshape(-1, x.shape[-1]),)


def _lgw_into(xs: Sequence[torch.Tensor], a: dict, out: torch.Tensor) -> None:
    g, x = xs  # (..., n), (..., k) -> out (n, k)
    torch.mm(g.reshape(-1, g.shape[-1]).T, x.reshape(-1, x.shape[-1]), out=out)


LINEAR_GRAD_WEIGHT = define(OpDef(
    "linear_grad_weight", _lgw_infer, _lgw_sigs, _lgw_kernel,
    lambda ins, outs, a: 2 * numel(ins[0].shape) * ins[1].shape[-1],
    doc="dw = g^T @ x over all batch dims; batch-split g and x give a partial-sum P weight gradient.",
    kernel_into=_lgw_into,
))


# --- embedding -----------------------------------------------------------------------------------

def _emb_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("embedding_grad", ins, 2)
    g, ids = ins
    if g.shape[:-1] != ids.shape:
        raise ValueError(f"embedding_grad: gradient {g.shape} does not match ids {ids.shape} plus a feature dim")
    return [TensorMeta((int(a["num_embeddings"]), g.shape[-1]), g.dtype)]


def _emb_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    k = len(ins[1].shape)
    sigs = [Signature((S(d), S(d)), (P,)) for d in range(k)]
    return sigs + [Signature((S(k), B), (S(1),)), Signature((B, B), (S(0),)), linear_in(2, 1, 0)]


def _emb_localize(a: dict, ctx: LocalContext) -> dict:
    (r0, r1), _ = ctx.out_blocks[0]
    return {**a, "num_embeddings": r1 - r0, "vocab_start": r0}


def _emb_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    g, ids = xs
    n, start = int(a["num_embeddings"]), int(a.get("vocab_start", 0))
    flat, g2 = ids.reshape(-1), g.reshape(-1, g.shape[-1])
    keep = (flat >= start) & (flat < start + n)
    pad = a.get("padding_idx")
    if pad is not None:
        keep &= flat != pad
    out = g.new_zeros((n, g.shape[-1]))
    out.index_add_(0, flat[keep] - start, g2[keep])
    return (out,)


EMBEDDING_GRAD = define(OpDef(
    "embedding_grad", _emb_infer, _emb_sigs, _emb_kernel, lambda ins, outs, a: numel(ins[0].shape),
    _emb_localize,
    doc="Scatter-add of the output gradient into the rows of the table. With g and ids broadcast, "
        "each rank can build only its own vocabulary rows (S(0), the vocab-parallel table).",
))


# --- cross entropy (mean over N) ------------------------------------------------------------------

def _ce_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("cross_entropy_grad", ins, 3)
    g, logits, target = ins
    if len(logits.shape) != 2 or target.shape != logits.shape[:1] or g.shape != ():
        raise ValueError(f"cross_entropy_grad: needs a scalar gradient, logits (N, C) and target (N,), "
                         f"got {g.shape}, {logits.shape}, {target.shape}")
    return [TensorMeta(logits.shape, logits.dtype)]


def _ce_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    """Autograd's own two kernels for ``F.cross_entropy`` (mean) with the global N as the total weight:
    each row of the gradient is bit for bit the row single-device torch computes."""
    g, logits, target = xs
    logp = torch.log_softmax(logits, dim=1)
    count = torch.tensor(float(a.get("count", logits.shape[0])), dtype=logits.dtype)
    d_logp = torch.ops.aten.nll_loss_backward(g, logp, target, None, 1, -100, count)  # 1: mean
    return (torch.ops.aten._log_softmax_backward_data(d_logp, logp, 1, logits.dtype),)


CROSS_ENTROPY_GRAD = define(OpDef(
    "cross_entropy_grad", _ce_infer,
    lambda ins, a: [Signature((B, S(0), S(0)), (S(0),)), Signature((P, B, B), (P,))],
    _ce_kernel, lambda ins, outs, a: 5 * numel(ins[1].shape),
    lambda a, ctx: {**a, "count": ctx.in_metas[1].shape[0]},
    doc="(softmax(logits) - onehot(target)) * g / N, with N the global batch (so a batch shard "
        "still divides by the whole batch).",
))


# --- conv2d --------------------------------------------------------------------------------------

def _conv_attrs(a: dict) -> tuple:
    return (tuple(a.get("stride", (1, 1))), tuple(a.get("padding", (0, 0))), tuple(a.get("dilation", (1, 1))),
            int(a.get("groups", 1)))


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _cgi_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("conv2d_grad_input", ins, 2)
    return [TensorMeta(tuple(a["out_shape"]), ins[0].dtype)]


def _cgi_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    sigs = [Signature((S(0), B), (S(0),))]
    if int(a.get("groups", 1)) == 1:
        sigs += [Signature((S(1), S(0)), (P,)), Signature((B, S(1)), (S(1),))]
    return sigs + [linear_in(2, 1, 0), linear_in(2, 1, 1)]


def _cgi_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    g, w = xs
    stride, padding, dilation, groups = _conv_attrs(a)
    return (torch.nn.grad.conv2d_input(tuple(a["out_shape"]), w, g, _pair(stride), _pair(padding),
                                       _pair(dilation), groups),)


def _conv_flops(ins: Sequence[TensorMeta], outs: Sequence[TensorMeta], a: dict) -> int:
    return 2 * numel(ins[0].shape) * numel(ins[1].shape[1:])  # g (N, Cout, H, W), w (Cout, Cin/groups, kh, kw)


CONV2D_GRAD_INPUT = define(OpDef(
    "conv2d_grad_input", _cgi_infer, _cgi_sigs, _cgi_kernel, _conv_flops, _localize_out_shape,
    doc="dx of conv2d(x, w): batch splits stay, an output-channel split gives P (groups=1).",
))


def _cgw_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("conv2d_grad_weight", ins, 2)
    return [TensorMeta(tuple(a["out_shape"]), ins[0].dtype)]


def _cgw_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    sigs = [Signature((S(0), S(0)), (P,))]
    if int(a.get("groups", 1)) == 1:
        sigs += [Signature((S(1), B), (S(0),)), Signature((B, S(1)), (S(1),))]
    return sigs + [linear_in(2, 1, 0), linear_in(2, 1, 1)]


def _cgw_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    g, x = xs
    stride, padding, dilation, groups = _conv_attrs(a)
    return (torch.nn.grad.conv2d_weight(x, tuple(a["out_shape"]), g, _pair(stride), _pair(padding),
                                        _pair(dilation), groups),)


CONV2D_GRAD_WEIGHT = define(OpDef(
    "conv2d_grad_weight", _cgw_infer, _cgw_sigs, _cgw_kernel,
    lambda ins, outs, a: 2 * numel(ins[0].shape) * numel(outs[0].shape[1:]), _localize_out_shape,
    doc="dw of conv2d(x, w): batch-split g and x give P; an output-channel split of g gives S(0).",
))


# --- layer norm -----------------------------------------------------------------------------------

def _ln_grad_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("layer_norm_grad", ins, 3)
    g, x, w = ins
    check_same_shape("layer_norm_grad", g, x, "gradient and input")
    ns = tuple(a["normalized_shape"])
    if x.shape[len(x.shape) - len(ns):] != ns or w.shape != ns:
        raise ValueError(f"layer_norm_grad: input {x.shape} and weight {w.shape} do not end in "
                         f"normalized_shape {ns}")
    return [meta_like(x), meta_like(w), meta_like(w)]


def _ln_grad_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    nb = len(ins[1].shape) - len(tuple(a["normalized_shape"]))
    sigs = [Signature((S(d), S(d), B), (S(d), P, P)) for d in range(nb)]
    return sigs + [Signature((P, B, B), (P, P, P))]


def _ln_grad_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor, ...]:
    g, x, w = xs
    ns = list(a["normalized_shape"])
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, ns, w, None, a["eps"])
    dx, dw, _ = torch.ops.aten.native_layer_norm_backward(g, x, ns, mean, rstd, w, None, [True, True, False])
    batch = tuple(range(x.ndim - len(ns)))
    db = g.sum(dim=batch) if batch else g.clone()
    return dx, dw, db


LAYER_NORM_GRAD = define(OpDef(
    "layer_norm_grad", _ln_grad_infer, _ln_grad_sigs, _ln_grad_kernel, ew_flops(10),
    doc="layer_norm_grad(g, x, weight) -> (dx, dweight, dbias); batch splits give P weight grads.",
))
