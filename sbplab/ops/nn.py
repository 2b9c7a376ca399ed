"""softmax, log_softmax and layer_norm: ops that need a whole row to normalise it.

They split freely on every dim they do not normalise over, and on no other; nothing about them is
linear or monotone in x, so no partial passes through x. layer_norm's affine part
``xhat * w + b`` is linear in (w, b) together (``B, P, P -> P``) and monotone in b
(``B, B, P(max) -> P(max)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..sbp import B, S
from ._util import PMAX, PMIN, PSUM, fail, need_float, need_inputs, norm_dim, numel, sig
from .registry import OpDef, Signature, TensorMeta, register


def _softmax_like(name: str) -> OpDef:
    fn = torch.softmax if name == "softmax" else torch.log_softmax

    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        need_inputs(name, ins, (1,))
        x = ins[0]
        need_float(name, x, "x")
        if not x.shape:
            fail(name, "needs a tensor with at least one dim, got a scalar (shape ())")
        if "dim" not in attrs:
            fail(name, f"needs attr dim (an int in -{len(x.shape)}..{len(x.shape) - 1})")
        norm_dim(name, attrs["dim"], x.shape)
        return [TensorMeta(x.shape, x.dtype)]

    def signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
        r = len(ins[0].shape)
        d = norm_dim(name, attrs["dim"], ins[0].shape)
        return [sig([S(e)], S(e)) for e in range(r) if e != d]

    def kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
        return (fn(xs[0], dim=attrs["dim"]),)

    def flops(ins, outs, attrs) -> int:
        return 5 * numel(ins[0].shape)

    return OpDef(name, infer, signatures, kernel, flops=flops, doc=f"{name} along attr dim")


register(_softmax_like("softmax"))
register(_softmax_like("log_softmax"))


# ---- layer_norm -----------------------------------------------------------------------------


def _ln_shape(x: TensorMeta, attrs: dict) -> tuple[int, ...]:
    ns = attrs.get("normalized_shape")
    if isinstance(ns, int) and not isinstance(ns, bool):
        ns = (ns,)
    if not isinstance(ns, (tuple, list)) or not ns or not all(isinstance(n, int) for n in ns):
        fail("layer_norm", f"attr normalized_shape must be a non-empty tuple of ints, got {ns!r}")
    ns = tuple(ns)
    if len(ns) > len(x.shape) or x.shape[len(x.shape) - len(ns):] != ns:
        fail("layer_norm", f"normalized_shape {ns} must be the trailing dims of x {x.shape}")
    return ns


def _ln_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("layer_norm", ins, (3,))
    x, w, b = ins
    need_float("layer_norm", x, "x")
    ns = _ln_shape(x, attrs)
    if w.shape != ns or b.shape != ns:
        fail("layer_norm", f"weight {w.shape} and bias {b.shape} must both have shape normalized_shape "
                           f"{ns} (x {x.shape})")
    return [TensorMeta(x.shape, x.dtype)]


def _ln_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    x = ins[0]
    lead = len(x.shape) - len(_ln_shape(x, attrs))
    sigs = [sig([S(d), B, B], S(d)) for d in range(lead)]
    # xhat * w + b is linear in (w, b) together, and monotone in b alone
    return sigs + [sig([B, PSUM, PSUM], PSUM), sig([B, B, PMAX], PMAX), sig([B, B, PMIN], PMIN)]


def _ln_kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    x, w, b = xs
    ns = attrs["normalized_shape"]
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    return (F.layer_norm(x, ns, w, b, eps=float(attrs.get("eps", 1e-5))),)


register(OpDef("layer_norm", _ln_infer, _ln_signatures, _ln_kernel,
               flops=lambda ins, outs, attrs: 8 * numel(ins[0].shape),
               doc="layer norm over the trailing normalized_shape dims; inputs x, weight, bias; attr eps"))
