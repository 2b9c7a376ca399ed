"""conv2d: torch's 2-D convolution, NCHW, weight (O, C/groups, kh, kw), optional bias (O,).

Signatures:
- ``x S(0), w B, b B -> S(0)``: data parallel over the batch;
- ``x B, w S(0), b S(0) -> S(1)``: each rank computes some output channels (groups=1);
- ``x S(1), w S(1), b P -> P``: each rank convolves some input channels, the sum over ranks is the
  output; the bias is P so that it is added once (groups=1);
- ``x P, w B, b P -> P`` and ``x B, w P, b P -> P``: convolution is linear in x and in w;
- ``x B, w B, b P(max) -> P(max)`` (and min): the bias is added last;
- a 1x1 kernel with stride 1 and no padding is pointwise in space, so H and W split too.
Other spatial splits need halo exchange, which these signatures do not describe.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..sbp import B, S
from ._util import PMAX, PMIN, PSUM, fail, need_float, need_inputs, pair, sig
from .registry import OpDef, Signature, TensorMeta, register


def _conv_attrs(attrs: dict) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int]:
    stride = pair("conv2d", attrs.get("stride", 1), "stride")
    padding = pair("conv2d", attrs.get("padding", 0), "padding")
    dilation = pair("conv2d", attrs.get("dilation", 1), "dilation")
    groups = attrs.get("groups", 1)
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        fail("conv2d", f"stride {stride} and dilation {dilation} must be >= 1, padding {padding} >= 0")
    if not isinstance(groups, int) or groups < 1:
        fail("conv2d", f"groups must be an int >= 1, got {groups!r}")
    return stride, padding, dilation, groups


def _conv_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("conv2d", ins, (2, 3))
    x, w = ins[0], ins[1]
    need_float("conv2d", x, "x")
    stride, padding, dilation, groups = _conv_attrs(attrs)
    if len(x.shape) != 4 or len(w.shape) != 4:
        fail("conv2d", f"needs x (N, C, H, W) and w (O, C/groups, kh, kw), got shapes {x.shape} and "
                       f"{w.shape}")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c % groups or o % groups or cg * groups != c:
        fail("conv2d", f"x {x.shape} has {c} channels but w {w.shape} with groups={groups} expects "
                       f"{cg * groups}; C and O must be divisible by groups")
    if len(ins) == 3 and ins[2].shape != (o,):
        fail("conv2d", f"bias {ins[2].shape} must have shape ({o},) to match w {w.shape}")
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if ho < 1 or wo < 1:
        fail("conv2d", f"kernel {(kh, kw)} (dilation {dilation}) is larger than the padded input "
                       f"{x.shape} (padding {padding}); the output would be empty")
    return [TensorMeta((n, o, ho, wo), torch.promote_types(x.dtype, w.dtype))]


def _conv_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    bias = len(ins) == 3
    stride, padding, dilation, groups = _conv_attrs(attrs)

    def s(x, w, b, out):
        return sig([x, w, b] if bias else [x, w], out)

    sigs = [s(S(0), B, B, S(0)), s(PSUM, B, PSUM, PSUM), s(B, PSUM, PSUM, PSUM)]
    if groups == 1:
        sigs += [s(B, S(0), S(0), S(1)), s(S(1), S(1), PSUM, PSUM)]
    if ins[1].shape[2:] == (1, 1) and stride == (1, 1) and padding == (0, 0):
        sigs += [s(S(2), B, B, S(2)), s(S(3), B, B, S(3))]
    if bias:  # the bias is added last and unchanged: its max or min over ranks passes through
        sigs += [sig([B, B, p], p) for p in (PMAX, PMIN)]
    return sigs


def _conv_kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    stride, padding, dilation, groups = _conv_attrs(attrs)
    b = xs[2] if len(xs) == 3 else None
    return (F.conv2d(xs[0], xs[1], b, stride=stride, padding=padding, dilation=dilation, groups=groups),)


def _conv_flops(ins, outs, attrs) -> int:
    n, o, ho, wo = outs[0].shape
    _, cg, kh, kw = ins[1].shape
    return 2 * n * o * ho * wo * cg * kh * kw + (n * o * ho * wo if len(ins) == 3 else 0)


register(OpDef("conv2d", _conv_infer, _conv_signatures, _conv_kernel, flops=_conv_flops,
               doc="2-D convolution; inputs x, w[, b]; attrs stride, padding, dilation, groups"))
