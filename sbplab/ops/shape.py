"""Ops that only move elements: transpose, permute, reshape/view, concat, slice.

Moving elements commutes with every reduction, so P, P(max) and P(min) pass through unchanged.
A split follows its dim to wherever the op puts it. reshape keeps ``S(d) -> S(d')`` only where the
elements before the split line up (equal prefix products); balanced splits of different sizes can
still disagree on where a piece ends, and the per-rank local-shape check of ``nd_signatures``
rejects exactly those, because the local target shape is the output block's shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sbp import S
from ._util import fail, need_inputs, norm_dim, numel, selection_partials, sig
from .registry import LocalContext, OpDef, Signature, TensorMeta, register

# ---- transpose and permute ------------------------------------------------------------------


def _perm(name: str, x: TensorMeta, attrs: dict) -> tuple[int, ...]:
    r = len(x.shape)
    if name == "transpose":
        if "dim0" not in attrs or "dim1" not in attrs:
            fail(name, f"needs attrs dim0 and dim1 (ints in -{r}..{r - 1}), got {sorted(attrs)}")
        d0 = norm_dim(name, attrs["dim0"], x.shape, "dim0")
        d1 = norm_dim(name, attrs["dim1"], x.shape, "dim1")
        p = list(range(r))
        p[d0], p[d1] = p[d1], p[d0]
        return tuple(p)
    dims = attrs.get("dims")
    if not isinstance(dims, (tuple, list)) or len(dims) != r:
        fail(name, f"dims must list all {r} dims of a tensor of shape {x.shape}, got {dims!r}")
    p = tuple(norm_dim(name, d, x.shape) for d in dims)
    if sorted(p) != list(range(r)):
        fail(name, f"dims {tuple(dims)} is not a permutation of 0..{r - 1} (tensor shape {x.shape})")
    return p


def _permute_like(name: str) -> OpDef:
    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        need_inputs(name, ins, (1,))
        x = ins[0]
        if name == "transpose" and len(x.shape) < 1:
            fail(name, "needs a tensor with at least one dim, got a scalar (shape ())")
        p = _perm(name, x, attrs)
        return [TensorMeta(tuple(x.shape[i] for i in p), x.dtype)]

    def signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
        p = _perm(name, ins[0], attrs)
        # output dim j holds input dim p[j], so input S(p[j]) becomes output S(j)
        return [sig([S(p[j])], S(j)) for j in range(len(p))] + selection_partials(1)

    def kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
        x = xs[0]
        if name == "transpose":
            return (x.transpose(attrs["dim0"], attrs["dim1"]).contiguous(),)
        return (x.permute(tuple(attrs["dims"])).contiguous(),)

    doc = "swap two dims (attrs dim0, dim1)" if name == "transpose" else "reorder dims (attr dims)"
    return OpDef(name, infer, signatures, kernel, doc=doc)


register(_permute_like("transpose"))
register(_permute_like("permute"))

# ---- reshape / view -------------------------------------------------------------------------


def _target(name: str, x: TensorMeta, attrs: dict) -> tuple[int, ...]:
    shape = attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(s, int) for s in shape):
        fail(name, f"attr shape must be a tuple of ints, got {shape!r}")
    shape = tuple(shape)
    free = [i for i, s in enumerate(shape) if s == -1]
    if len(free) > 1 or any(s < -1 for s in shape):
        fail(name, f"shape {shape} may hold at most one -1 and no other negative size")
    if free:
        known = numel([s for s in shape if s != -1])
        if known == 0 or numel(x.shape) % known:
            fail(name, f"cannot reshape {x.shape} ({numel(x.shape)} elements) into {shape}")
        shape = shape[: free[0]] + (numel(x.shape) // known,) + shape[free[0] + 1:]
    if numel(shape) != numel(x.shape):
        fail(name, f"cannot reshape {x.shape} ({numel(x.shape)} elements) into {shape} "
                   f"({numel(shape)} elements); the element counts must match")
    return shape


def _reshape_like(name: str) -> OpDef:
    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        need_inputs(name, ins, (1,))
        return [TensorMeta(_target(name, ins[0], attrs), ins[0].dtype)]

    def signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
        src = ins[0].shape
        dst = _target(name, ins[0], attrs)
        sigs = []
        for d in range(len(src)):
            for e in range(len(dst)):
                if numel(src[:d]) == numel(dst[:e]):
                    sigs.append(sig([S(d)], S(e)))
        return sigs + selection_partials(1)

    def kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
        return (xs[0].reshape(tuple(attrs["shape"])),)

    def localize(attrs: dict, ctx: LocalContext) -> dict:
        return {**attrs, "shape": tuple(e - s for s, e in ctx.out_blocks[0])}

    return OpDef(name, infer, signatures, kernel, localize=localize,
                 doc="same elements, new shape (attr shape, one -1 allowed); row-major order")


register(_reshape_like("reshape"))
register(_reshape_like("view"))

# ---- concat ---------------------------------------------------------------------------------


def _concat_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    if len(ins) < 1:
        fail("concat", "needs at least one input")
    r = len(ins[0].shape)
    shapes = [m.shape for m in ins]
    if r == 0 or any(len(s) != r for s in shapes):
        fail("concat", f"inputs must all have the same number of dims (>= 1), got shapes {shapes}")
    d = norm_dim("concat", attrs.get("dim", 0), shapes[0])
    for s in shapes:
        if s[:d] + s[d + 1:] != shapes[0][:d] + shapes[0][d + 1:]:
            fail("concat", f"shapes {shapes} differ outside dim {d}; only the concat dim may differ")
    dtype = ins[0].dtype
    for m in ins[1:]:
        dtype = torch.promote_types(dtype, m.dtype)
    out = list(shapes[0])
    out[d] = sum(s[d] for s in shapes)
    return [TensorMeta(tuple(out), dtype)]


def _concat_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    r = len(ins[0].shape)
    d = norm_dim("concat", attrs.get("dim", 0), ins[0].shape)
    n = len(ins)
    return [sig([S(e)] * n, S(e)) for e in range(r) if e != d] + selection_partials(n)


register(OpDef("concat", _concat_infer, _concat_signatures,
               lambda xs, attrs: (torch.cat(list(xs), dim=attrs.get("dim", 0)),), variadic=True,
               doc="join inputs along attr dim; splits on other dims, partials pass through"))

# ---- slice ----------------------------------------------------------------------------------


def _slice_range(x: TensorMeta, attrs: dict) -> tuple[int, range]:
    r = len(x.shape)
    if r == 0:
        fail("slice", "needs a tensor with at least one dim, got a scalar (shape ())")
    d = norm_dim("slice", attrs.get("dim", 0), x.shape)
    step = attrs.get("step", 1)
    if step is None:
        step = 1
    if not isinstance(step, int) or step < 1:
        fail("slice", f"step must be an int >= 1, got {step!r}")
    start, stop = attrs.get("start"), attrs.get("stop")
    for v, what in ((start, "start"), (stop, "stop")):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            fail("slice", f"{what} must be an int or None, got {v!r}")
    return d, range(x.shape[d])[slice(start, stop, step)]


def _slice_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("slice", ins, (1,))
    x = ins[0]
    d, idx = _slice_range(x, attrs)
    shape = list(x.shape)
    shape[d] = len(idx)
    return [TensorMeta(tuple(shape), x.dtype)]


def _slice_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    d, _ = _slice_range(ins[0], attrs)
    return [sig([S(e)], S(e)) for e in range(len(ins[0].shape)) if e != d] + selection_partials(1)


def _slice_kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    x = xs[0]
    d = attrs.get("dim", 0) % x.dim()
    index = (slice(None),) * d + (slice(attrs.get("start"), attrs.get("stop"), attrs.get("step") or 1),)
    return (x[index].clone(),)


register(OpDef("slice", _slice_infer, _slice_signatures, _slice_kernel,
               doc="x[..., start:stop:step, ...] along attr dim (Python slice rules, step >= 1)"))
