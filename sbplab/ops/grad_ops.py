"""Gradient ops of the elementwise, reduction and normalisation families, with SBP signatures.

Each backward op is an ordinary registry op: it has shape inference, 1-D signatures, a kernel and
a FLOP count, so deduction, lowering and the executors treat the backward pass like the forward.
Most gradients are linear in the incoming gradient ``g``: a partial-sum ``g`` with the other
inputs broadcast gives a partial-sum result, which is how ``P`` flows backwards without boxing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sbp import P, S
from .opkit import (
    block_shape,
    check_arity,
    check_same_shape,
    define,
    ew_flops,
    linear_in,
    meta_like,
    same_split,
)
from .registry import LocalContext, OpDef, Signature, TensorMeta


def _norm_dim(d: int, nd: int) -> int:
    return d + nd if d < 0 else d


def _norm_dims(dims, nd: int) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(nd))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted(_norm_dim(d, nd) for d in dims))


def _localize_out_shape(attrs: dict, ctx: LocalContext) -> dict:
    """Ops whose output shape is an attribute: each shard makes its own block's shape."""
    return {**attrs, "out_shape": block_shape(ctx.out_blocks[0])}


# --- constants and scalars ----------------------------------------------------------------------

def _fill_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("fill", ins, 0)
    return [TensorMeta(tuple(a["shape"]), a.get("dtype", torch.float32))]


FILL = define(OpDef(
    "fill", _fill_infer, lambda ins, a: [],
    lambda xs, a: (torch.full(tuple(a["shape"]), a["value"], dtype=a.get("dtype", torch.float32)),),
    doc="A constant tensor (the seed 1 of the loss gradient). Broadcast only.",
))


def _unary_infer(name: str):
    def infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
        check_arity(name, ins, 1)
        return [meta_like(ins[0])]
    return infer


SCALE = define(OpDef(
    "scale", _unary_infer("scale"),
    lambda ins, a: same_split(1, 1, range(len(ins[0].shape))) + [linear_in(1, 1, 0)],
    lambda xs, a: (xs[0] * a["factor"],), ew_flops(1),
    doc="x * factor for a Python number factor; linear, so P stays P.",
))

ADD_SCALAR = define(OpDef(
    "add_scalar", _unary_infer("add_scalar"),
    lambda ins, a: same_split(1, 1, range(len(ins[0].shape))),
    lambda xs, a: (xs[0] + a["value"],), ew_flops(1),
    doc="x + value for a Python number; not linear, so no P.",
))

ACC = define(OpDef(
    "acc", _unary_infer("acc"),
    lambda ins, a: same_split(1, 1, range(len(ins[0].shape))) + [linear_in(1, 1, 0)],
    lambda xs, a: (xs[0] * a.get("scale", 1.0),), ew_flops(1),
    doc="Micro-batch accumulation (OneFlow's acc): the output is scale * the sum of the input over "
        "all micro-batches of a step; the kernel is one micro-batch's term.",
))


# --- activations ----------------------------------------------------------------------------------

def _binary_same_infer(name: str):
    def infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
        check_arity(name, ins, 2)
        check_same_shape(name, ins[0], ins[1])
        return [meta_like(ins[0])]
    return infer


def _ew_grad_sigs(ins: Sequence[TensorMeta], a: dict, skip: int | None = None) -> list[Signature]:
    nd = len(ins[0].shape)
    dims = [d for d in range(nd) if skip is None or d != _norm_dim(skip, nd)]
    return same_split(len(ins), 1, dims) + [linear_in(len(ins), 1, 0)]


RELU_GRAD = define(OpDef(
    "relu_grad", _binary_same_infer("relu_grad"), _ew_grad_sigs,
    lambda xs, a: (torch.ops.aten.threshold_backward(xs[0], xs[1], 0),), ew_flops(1),  # autograd's own kernel
    doc="relu_grad(g, y): g where the relu output y is positive.",
))

GELU_GRAD = define(OpDef(
    "gelu_grad", _binary_same_infer("gelu_grad"), _ew_grad_sigs,
    lambda xs, a: (torch.ops.aten.gelu_backward(xs[0], xs[1], approximate=a.get("approximate", "none")),),
    ew_flops(20),
    doc="gelu_grad(g, x, approximate): g * gelu'(x).",
))

TANH_GRAD = define(OpDef(
    "tanh_grad", _binary_same_infer("tanh_grad"), _ew_grad_sigs,
    lambda xs, a: (torch.ops.aten.tanh_backward(xs[0], xs[1]),), ew_flops(3),
    doc="tanh_grad(g, y): g * (1 - y^2) with y the tanh output.",
))

SOFTMAX_GRAD = define(OpDef(
    "softmax_grad", _binary_same_infer("softmax_grad"), lambda ins, a: _ew_grad_sigs(ins, a, a["dim"]),
    lambda xs, a: (torch.ops.aten._softmax_backward_data(xs[0], xs[1], a["dim"], xs[0].dtype),), ew_flops(4),
    doc="softmax_grad(g, y, dim): y * (g - sum(g * y, dim)); the softmax dim must be whole.",
))

LOG_SOFTMAX_GRAD = define(OpDef(
    "log_softmax_grad", _binary_same_infer("log_softmax_grad"), lambda ins, a: _ew_grad_sigs(ins, a, a["dim"]),
    lambda xs, a: (torch.ops.aten._log_softmax_backward_data(xs[0], xs[1], a["dim"], xs[0].dtype),),
    ew_flops(4),
    doc="log_softmax_grad(g, y, dim): g - exp(y) * sum(g, dim); the dim must be whole.",
))


# --- reductions and shape changes ---------------------------------------------------------------

def _reduced_dim_map(nd: int, dims: tuple[int, ...], keepdim: bool) -> dict[int, int]:
    """Input dim -> output dim of a reduction over ``dims`` (kept dims only)."""
    out, j = {}, 0
    for i in range(nd):
        if i in dims:
            j += 1 if keepdim else 0
            continue
        out[i] = j
        j += 1
    return out


def _sum_grad_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("sum_grad", ins, 1)
    shape = tuple(a["out_shape"])
    dims = _norm_dims(a.get("dims"), len(shape))
    want = tuple(1 if (i in dims and a.get("keepdim")) else s for i, s in enumerate(shape)
                 if a.get("keepdim") or i not in dims)
    if ins[0].shape != want:
        raise ValueError(f"sum_grad: gradient of shape {ins[0].shape} does not fit a reduction of "
                         f"{shape} over dims {dims} (expected {want})")
    return [TensorMeta(shape, ins[0].dtype)]


def _sum_grad_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    shape = tuple(a["out_shape"])
    dims = _norm_dims(a.get("dims"), len(shape))
    m = _reduced_dim_map(len(shape), dims, bool(a.get("keepdim")))
    return [Signature((S(j),), (S(i),)) for i, j in m.items()] + [linear_in(1, 1, 0)]


def _sum_grad_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    shape = tuple(a["out_shape"])
    g = xs[0]
    if not a.get("keepdim"):
        for d in _norm_dims(a.get("dims"), len(shape)):
            g = g.unsqueeze(d)
    out = g.expand(shape).contiguous()
    scale = a.get("scale", 1.0)
    return (out * scale if scale != 1.0 else out,)


SUM_GRAD = define(OpDef(
    "sum_grad", _sum_grad_infer, _sum_grad_sigs, _sum_grad_kernel, ew_flops(1), _localize_out_shape,
    doc="Gradient of sum/mean over dims: g spread back over the reduced dims (times scale, 1/n for mean).",
))


def _grad_sum_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("grad_sum", ins, 1)
    nd = len(ins[0].shape)
    dims, squeeze = _norm_dims(a["dims"], nd), _norm_dims(a.get("squeeze", ()), nd)
    kept = [1 if i in dims else s for i, s in enumerate(ins[0].shape)]
    if any(kept[d] != 1 for d in squeeze):
        raise ValueError(f"grad_sum: can only squeeze reduced or size-1 dims, got squeeze={squeeze} for {kept}")
    return [TensorMeta(tuple(s for i, s in enumerate(kept) if i not in squeeze), ins[0].dtype)]


def _grad_sum_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    nd = len(ins[0].shape)
    dims, squeeze = _norm_dims(a["dims"], nd), _norm_dims(a.get("squeeze", ()), nd)
    sigs = [Signature((S(d),), (P,)) for d in dims]
    for i in range(nd):
        if i not in dims and i not in squeeze:
            sigs.append(Signature((S(i),), (S(i - sum(1 for q in squeeze if q < i)),)))
    return sigs + [linear_in(1, 1, 0)]


def _grad_sum_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    x = xs[0]
    dims, squeeze = _norm_dims(a["dims"], x.ndim), _norm_dims(a.get("squeeze", ()), x.ndim)
    out = x.sum(dim=dims, keepdim=True) if dims else x.clone()
    return (out.squeeze(squeeze) if squeeze else out,)


def _grad_sum_into(xs: Sequence[torch.Tensor], a: dict, out: torch.Tensor) -> None:
    x = xs[0]
    dims = _norm_dims(a["dims"], x.ndim)
    if not dims:
        out.copy_(x.reshape(out.shape))
        return
    kept = tuple(1 if i in dims else s for i, s in enumerate(x.shape))  # the kept-dims shape of the sum
    torch.sum(x, dim=dims, keepdim=True, out=out.view(kept))


GRAD_SUM = define(OpDef(
    "grad_sum", _grad_sum_infer, _grad_sum_sigs, _grad_sum_kernel, ew_flops(1), kernel_into=_grad_sum_into,
    doc="Sum a gradient back to an operand's shape: sum over dims (kept), then drop the squeeze dims. "
        "A split reduced dim gives P: the addends are summed by whoever needs the whole.",
))


def _max_grad_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("max_grad", ins, 2)
    return [meta_like(ins[1])]


def _max_grad_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    nd = len(ins[1].shape)
    dim = _norm_dim(a["dim"], nd)
    m = _reduced_dim_map(nd, (dim,), bool(a.get("keepdim")))
    return [Signature((S(j), S(i)), (S(i),)) for i, j in m.items()] + [linear_in(2, 1, 0)]


def _max_grad_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    g, x = xs
    dim = _norm_dim(a["dim"], x.ndim)
    idx = (x.argmin if a.get("mode") == "min" else x.argmax)(dim, keepdim=True)
    g = g if a.get("keepdim") else g.unsqueeze(dim)
    return (torch.zeros_like(x).scatter(dim, idx, g),)


MAX_GRAD = define(OpDef(
    "max_grad", _max_grad_infer, _max_grad_sigs, _max_grad_kernel, ew_flops(1),
    doc="max_grad(g, x, dim, keepdim, mode): g placed at the argmax (mode min: argmin) of x along dim.",
))


def _slice_grad_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("slice_grad", ins, 1)
    return [TensorMeta(tuple(a["out_shape"]), ins[0].dtype)]


def _slice_grad_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    nd = len(a["out_shape"])
    dim = _norm_dim(a["dim"], nd)
    return same_split(1, 1, [d for d in range(nd) if d != dim]) + [linear_in(1, 1, 0)]


def _slice_grad_kernel(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    g = xs[0]
    out = g.new_zeros(tuple(a["out_shape"]))
    dim = _norm_dim(a["dim"], out.ndim)
    out[(slice(None),) * dim + (slice(a["start"], a["stop"], a["step"]),)] = g
    return (out,)


SLICE_GRAD = define(OpDef(
    "slice_grad", _slice_grad_infer, _slice_grad_sigs, _slice_grad_kernel, ew_flops(0), _localize_out_shape,
    doc="slice_grad(g, out_shape, dim, start, stop, step): g written into zeros at the sliced range.",
))


def _gather_grad_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("gather_grad", ins, 2)
    check_same_shape("gather_grad", ins[0], ins[1], "gradient and index")
    return [TensorMeta(tuple(a["out_shape"]), ins[0].dtype)]


def _gather_grad_sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    shape = tuple(a["out_shape"])
    dim = _norm_dim(a["dim"], len(shape))
    dims = [d for d in range(len(shape)) if d != dim and ins[1].shape[d] == shape[d]]
    return same_split(2, 1, dims) + [linear_in(2, 1, 0)]


GATHER_GRAD = define(OpDef(
    "gather_grad", _gather_grad_infer, _gather_grad_sigs,
    lambda xs, a: (xs[0].new_zeros(tuple(a["out_shape"])).scatter_add(a["dim"], xs[1], xs[0]),),
    ew_flops(1), _localize_out_shape,
    doc="gather_grad(g, index, out_shape, dim): scatter-add of g at index.",
))
