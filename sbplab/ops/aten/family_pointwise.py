"""Pointwise ops with broadcasting: split any output dim; inputs split the dim they broadcast into it.

An input whose dim is 1 (or missing) where the output's is not stays B: every rank needs all of it.
Linear ops also pass partial sums: ``P + P -> P``, ``P * B -> P``, ``P / B -> P``, ``where(c, P, P)``.
"""

from __future__ import annotations

from numbers import Number

from ...sbp import Partial
from ._common import B, P, S, Signature, TensorMeta, arg, sig

# the ops declared pointwise by name (torch's pointwise tag covers the rest; rules.py)
POINTWISE_OPS = tuple(f"aten.{n}" for n in (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "add.Scalar", "sub.Scalar", "mul.Scalar",
    "div.Scalar", "neg.default", "clone.default", "alias.default", "detach.default", "_to_copy.default",
    "where.self", "masked_fill.Scalar", "masked_fill.Tensor", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "rsqrt.default", "sqrt.default", "exp.default", "log.default", "tanh.default", "tanh_backward.default",
    "gelu.default", "gelu_backward.default", "silu.default", "silu_backward.default", "relu.default",
    "threshold_backward.default", "sigmoid.default", "sigmoid_backward.default", "sin.default",
    "cos.default", "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar", "lt.Tensor", "lt.Scalar",
    "le.Tensor", "le.Scalar", "gt.Tensor", "gt.Scalar", "ge.Tensor", "ge.Scalar", "bitwise_and.Tensor",
    "bitwise_or.Tensor", "bitwise_not.default", "logical_not.default", "logical_and.default",
    "floor_divide.default", "remainder.Scalar", "abs.default", "clamp.default", "maximum.default",
    "minimum.default", "reciprocal.default", "erf.default", "zeros_like.default", "ones_like.default",
    "empty_like.default", "full_like.default", "fill.Scalar", "native_dropout_backward.default",
))

# how each linear op passes P: "all" inputs P together, "one" P input with the others B (mul),
# "first" only the first input (div), "values" every input but the first (where's condition stays B)
LINEAR = {
    "aten.add.Tensor": "all", "aten.sub.Tensor": "all", "aten.add.Scalar": "all", "aten.sub.Scalar": "all",
    "aten.neg.default": "all", "aten.clone.default": "all", "aten.alias.default": "all",
    "aten.detach.default": "all", "aten._to_copy.default": "all", "aten.mul.Tensor": "one",
    "aten.mul.Scalar": "all", "aten.div.Tensor": "first", "aten.div.Scalar": "first",
    "aten.where.self": "values", "aten.masked_fill.Scalar": "first",
}


# one-input ops that never decrease (f(max(a, b)) = max(f(a), f(b))): a partial max or min passes
# through them, as OneFlow's and sbplab's own relu let it; neg turns one into the other
MONOTONE = {"aten.relu.default", "aten.exp.default", "aten.tanh.default", "aten.sigmoid.default",
            "aten.clone.default", "aten.alias.default", "aten.detach.default"}
PMAX, PMIN = Partial("max"), Partial("min")

# ops that read only their input's shape (and dtype): a partial input, whole on every rank, gives B
SHAPE_ONLY = {"aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default",
              "aten.empty_like.default"}


def _adds_nonzero(name: str, attrs: dict) -> bool:
    """``x + 1`` is not linear in x: each rank would add the 1 again. Only adding 0 passes P."""
    if name not in ("aten.add.Tensor", "aten.sub.Tensor", "aten.add.Scalar", "aten.sub.Scalar",
                    "aten.masked_fill.Scalar"):
        return False
    others = [a for a in attrs.get("args", ())[1:] if isinstance(a, Number) and not isinstance(a, bool)]
    return any(a != 0 for a in others)


def pointwise_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    out = outs[0]
    nd = len(out.shape)
    sigs = []
    for d in range(nd):
        if out.shape[d] <= 1:
            continue
        per_in = []
        for m in ins:
            k = len(m.shape) - (nd - d)  # the input's dim aligned with output dim d (broadcasting)
            per_in.append(S(k) if k >= 0 and m.shape[k] == out.shape[d] else B)
        outs_s = [S(d) if len(o.shape) == nd else B for o in outs]
        sigs.append(sig(per_in, outs_s))
    if name in SHAPE_ONLY and ins:
        sigs.append(sig([P] + [B] * (len(ins) - 1), [B] * len(outs)))
    if name in MONOTONE and len(ins) == 1:
        sigs += [sig([PMAX], [PMAX]), sig([PMIN], [PMIN])]
    elif name == "aten.neg.default":
        sigs += [sig([PMAX], [PMIN]), sig([PMIN], [PMAX])]
    how = LINEAR.get(name)
    if how is None or _adds_nonzero(name, attrs) or not ins:
        return sigs
    n, no = len(ins), len(outs)
    if how == "all":
        sigs.append(sig([P] * n, [P] * no))
    elif how == "one":
        sigs += [sig([P if j == i else B for j in range(n)], [P] * no) for i in range(n)]
    elif how == "first":
        sigs.append(sig([P] + [B] * (n - 1), [P] * no))
    elif how == "values" and n == 3:
        sigs.append(sig([B, P, P], [P] * no))
    return sigs


def triangle_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """triu and tril: which entries survive depends on their row and column, so the last two dims stay
    whole; the leading (batch, head) dims split, and the op is linear (a partial sum passes)."""
    shape = outs[0].shape
    return [sig([S(d)], [S(d)]) for d in range(len(shape) - 2) if shape[d] > 1] + [sig([P], [P])]


def dropout_note(attrs: dict) -> str:
    p = arg(attrs, 1, "p", 0.0)
    return f"p={p}"
