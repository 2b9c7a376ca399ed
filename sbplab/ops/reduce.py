"""Reductions: sum and mean over dims, max and min over one dim (values only).

A split on a kept dim stays a split (renumbered when the reduced dims are dropped). A split on a
reduced dim leaves each rank a partial result: P for sum and mean, P(max) for max, P(min) for min.
mean divides by the GLOBAL count of reduced elements (``localize`` tells each shard), so the
partial means of an ``S(batch)`` input add up to the exact mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sbp import S
from ._util import PMAX, PMIN, PSUM, fail, need_inputs, norm_dim, norm_dims, numel, sig
from .registry import LocalContext, OpDef, Signature, TensorMeta, register


def _out_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if d in dims else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in dims)


def _out_dim(d: int, dims: Sequence[int], keepdim: bool) -> int:
    """Where input dim ``d`` (not reduced) lands in the output."""
    return d if keepdim else d - sum(1 for r in dims if r < d)


def _reduce_signatures(ndim: int, dims: Sequence[int], keepdim: bool, partial) -> list[Signature]:
    sigs = [sig([S(d)], partial if d in dims else S(_out_dim(d, dims, keepdim))) for d in range(ndim)]
    return sigs + [sig([partial], partial)]


# ---- sum and mean ---------------------------------------------------------------------------


def _sum_like(name: str) -> OpDef:
    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        need_inputs(name, ins, (1,))
        x = ins[0]
        dims = norm_dims(name, attrs.get("dims"), x.shape) if x.shape else ()
        if name == "mean" and not x.dtype.is_floating_point:
            fail(name, f"needs a floating point input, got {x.dtype} of shape {x.shape}")
        dtype = x.dtype if x.dtype.is_floating_point else torch.int64
        return [TensorMeta(_out_shape(x.shape, dims, bool(attrs.get("keepdim", False))), dtype)]

    def signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
        x = ins[0]
        dims = norm_dims(name, attrs.get("dims"), x.shape) if x.shape else ()
        return _reduce_signatures(len(x.shape), dims, bool(attrs.get("keepdim", False)), PSUM)

    def kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
        x = xs[0]
        dims = norm_dims(name, attrs.get("dims"), x.shape) if x.dim() else ()
        keepdim = bool(attrs.get("keepdim", False))
        out = x.sum(dim=dims, keepdim=keepdim) if dims else x.clone()
        if name == "mean":
            count = attrs.get("count") or numel([x.shape[d] for d in dims])
            out = out / count
        return (out,)

    def localize(attrs: dict, ctx: LocalContext) -> dict:
        if name != "mean":
            return attrs
        shape = ctx.in_metas[0].shape
        dims = norm_dims(name, attrs.get("dims"), shape) if shape else ()
        return {**attrs, "count": numel([shape[d] for d in dims])}

    def flops(ins, outs, attrs) -> int:
        return numel(ins[0].shape)

    doc = "sum over dims (None: all)" if name == "sum" else "mean over dims (None: all), global count"
    return OpDef(name, infer, signatures, kernel, flops=flops, localize=localize, doc=doc)


register(_sum_like("sum"))
register(_sum_like("mean"))


# ---- max and min ----------------------------------------------------------------------------


def _extreme(name: str, partial) -> OpDef:
    fn = torch.amax if name == "max" else torch.amin

    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        need_inputs(name, ins, (1,))
        x = ins[0]
        if not x.shape:
            fail(name, "needs a tensor with at least one dim, got a scalar (shape ())")
        if "dim" not in attrs:
            fail(name, f"needs attr dim (an int in -{len(x.shape)}..{len(x.shape) - 1})")
        d = norm_dim(name, attrs["dim"], x.shape)
        if x.shape[d] == 0:
            fail(name, f"dim {d} of shape {x.shape} is empty; there is no {name} of nothing")
        return [TensorMeta(_out_shape(x.shape, (d,), bool(attrs.get("keepdim", False))), x.dtype)]

    def signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
        x = ins[0]
        d = norm_dim(name, attrs["dim"], x.shape)
        return _reduce_signatures(len(x.shape), (d,), bool(attrs.get("keepdim", False)), partial)

    def kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
        return (fn(xs[0], dim=attrs["dim"], keepdim=bool(attrs.get("keepdim", False))),)

    def flops(ins, outs, attrs) -> int:
        return numel(ins[0].shape)

    return OpDef(name, infer, signatures, kernel, flops=flops,
                 doc=f"{name} over one dim (values); a split of that dim gives {partial!r}")


register(_extreme("max", PMAX))
register(_extreme("min", PMIN))
