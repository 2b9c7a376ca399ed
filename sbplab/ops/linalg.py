"""matmul and linear: the ops whose signatures are the paper's first example.

For ``a (..., m, k) @ b (k, n)``:
- ``S(i), B -> S(i)`` for every leading dim i of a (rows, batch): each rank multiplies its rows;
- ``B, S(1) -> S(-1)``: each rank computes its columns;
- ``S(-1), S(0) -> P``: each rank multiplies its slice of k, the sum over ranks is the product;
- ``P, B -> P`` and ``B, P -> P``: the product is linear in each argument.
No P(max)/P(min) anywhere: max_i(a_i) @ b is not max_i(a_i @ b).
A batched ``b (..., k, n)`` with the same batch dims also splits batch dims on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..sbp import B, S
from ._util import PMAX, PMIN, PSUM, extremes_in_float, fail, need_inputs, numel, sig
from .registry import OpDef, Signature, TensorMeta, register


def same_dtype(op: str, ins: Sequence[TensorMeta]) -> None:
    """torch multiplies matrices of one dtype only (no promotion, no bool)."""
    dtypes = [m.dtype for m in ins]
    if len(set(dtypes)) > 1:
        fail(op, f"inputs of shapes {[m.shape for m in ins]} have dtypes {dtypes}; torch needs them all of one "
                 f"dtype (convert with .to(dtype) first)")
    if dtypes[0] == torch.bool:
        fail(op, f"torch does not multiply bool matrices (shapes {[m.shape for m in ins]}); convert to an int "
                 f"or float dtype first")


def _matmul_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("matmul", ins, (2,))
    a, b = ins
    if len(a.shape) < 2 or len(b.shape) < 2:
        fail("matmul", f"needs a (..., m, k) and b (k, n) or (..., k, n), got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        fail("matmul", f"inner dims differ: a {a.shape} has k={a.shape[-1]}, b {b.shape} has "
                       f"k={b.shape[-2]}; they must be equal")
    if len(b.shape) > 2 and b.shape[:-2] != a.shape[:-2]:
        fail("matmul", f"batched b {b.shape} must have the same batch dims as a {a.shape} "
                       f"(no broadcasting of batch dims); or pass a 2-D b")
    same_dtype("matmul", ins)
    dtype = torch.promote_types(a.dtype, b.dtype)
    return [TensorMeta(a.shape[:-1] + b.shape[-1:], dtype)]


def _matmul_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    a, b = ins
    r = len(a.shape)
    if len(b.shape) == 2:
        sigs = [sig([S(i), B], S(i)) for i in range(r - 1)]  # rows and batch dims of a
        sigs += [sig([B, S(1)], S(r - 1)), sig([S(r - 1), S(0)], PSUM)]
    else:
        sigs = [sig([S(i), S(i)], S(i)) for i in range(r - 2)]  # batch dims, both sides
        sigs += [sig([S(r - 2), B], S(r - 2)), sig([B, S(r - 1)], S(r - 1)), sig([S(r - 1), S(r - 2)], PSUM)]
    return sigs + [sig([PSUM, B], PSUM), sig([B, PSUM], PSUM)]


def _matmul_flops(ins: Sequence[TensorMeta], outs: Sequence[TensorMeta], attrs: dict) -> int:
    return 2 * numel(outs[0].shape) * ins[0].shape[-1]


register(OpDef("matmul", _matmul_infer, _matmul_signatures, lambda xs, attrs: (torch.matmul(xs[0], xs[1]),),
               flops=_matmul_flops, doc="a (..., m, k) @ b (k, n) or (..., k, n)"))


# ---- linear ---------------------------------------------------------------------------------


def _linear_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("linear", ins, (2, 3))
    x, w = ins[0], ins[1]
    if len(x.shape) < 1 or len(w.shape) != 2:
        fail("linear", f"needs x (..., in) and w (out, in), got shapes {x.shape} and {w.shape}")
    if x.shape[-1] != w.shape[1]:
        fail("linear", f"x {x.shape} has {x.shape[-1]} input features but w {w.shape} expects "
                       f"{w.shape[1]} (w is (out, in), torch's convention)")
    if len(ins) == 3 and ins[2].shape != (w.shape[0],):
        fail("linear", f"bias {ins[2].shape} must have shape ({w.shape[0]},) to match w {w.shape}")
    same_dtype("linear", ins)
    dtype = torch.promote_types(x.dtype, w.dtype)
    return [TensorMeta(x.shape[:-1] + (w.shape[0],), dtype)]


def _linear_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    bias = len(ins) == 3
    r = len(ins[0].shape)

    def s(x, w, b, out):
        return sig([x, w, b] if bias else [x, w], out)

    sigs = [s(S(i), B, B, S(i)) for i in range(r - 1)]  # data parallel over batch dims
    sigs += [
        s(B, S(0), S(0), S(r - 1)),  # column parallel: each rank owns some output features
        s(S(r - 1), S(1), PSUM, PSUM),  # row parallel: bias as P so it is added once
        s(PSUM, B, PSUM, PSUM),
        s(B, PSUM, PSUM, PSUM),
    ]
    if bias:  # x @ w^T + max_i(b_i) = max_i(x @ w^T + b_i)
        sigs += extremes_in_float([sig([B, B, p], p) for p in (PMAX, PMIN)], ins[0].dtype)
    return sigs


def _linear_kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    return (F.linear(xs[0], xs[1], xs[2] if len(xs) == 3 else None),)


def _linear_flops(ins: Sequence[TensorMeta], outs: Sequence[TensorMeta], attrs: dict) -> int:
    n = 2 * numel(outs[0].shape) * ins[1].shape[1]
    return n + (numel(outs[0].shape) if len(ins) == 3 else 0)


register(OpDef("linear", _linear_infer, _linear_signatures, _linear_kernel, flops=_linear_flops,
               doc="x (..., in) @ w(out, in)^T + b(out); torch.nn.functional.linear"))
