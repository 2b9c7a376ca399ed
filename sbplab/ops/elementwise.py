"""Elementwise ops: add/sub/mul/div with torch broadcasting, and neg/relu/gelu/tanh/exp.

Splits: any output dim may be split; each input splits the matching dim, or stays B where it
broadcasts that dim (size 1 or missing). Partials follow from algebra on the addends x = sum_i x_i:
- linear in an input keeps P (add P,P->P; mul P,B->P; div P,B->P);
- monotone non-decreasing keeps P(max) and P(min) (relu, tanh, exp: f(max x_i) = max f(x_i));
  negation swaps them; gelu dips below zero near -0.75, so it is not monotone and keeps nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..sbp import B, S
from ._util import PMAX, PMIN, PSUM, extremes_in_float, fail, float_dtype, need_inputs, numel, sig
from .registry import OpDef, Signature, TensorMeta, register

# ---- binary ---------------------------------------------------------------------------------


def broadcast_shape(op: str, a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """torch's broadcasting, in plain Python (torch.broadcast_shapes is slow on this hot path)."""
    r = max(len(a), len(b))
    pa, pb = (1,) * (r - len(a)) + tuple(a), (1,) * (r - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            fail(op, f"shapes {tuple(a)} and {tuple(b)} do not broadcast; aligned from the right, "
                     f"each pair of dims must be equal or one of them 1")
        out.append(y if x == 1 else x)
    return tuple(out)


def _category(d: torch.dtype) -> int:
    return 3 if d.is_complex else 2 if d.is_floating_point else 0 if d == torch.bool else 1


def result_dtype(a: TensorMeta, b: TensorMeta) -> torch.dtype:
    """torch's promotion of two tensors: a 0-d operand (a lifted Python number) decides the dtype only
    where its category (bool < int < float < complex) is higher: float32 (3,) + float64 () is float32."""
    if (len(a.shape) == 0) == (len(b.shape) == 0):
        return torch.promote_types(a.dtype, b.dtype)
    dim, zero = (a, b) if len(b.shape) == 0 else (b, a)
    return torch.promote_types(a.dtype, b.dtype) if _category(zero.dtype) > _category(dim.dtype) else dim.dtype


def broadcast_splits(metas: Sequence[TensorMeta], out_shape: Sequence[int]) -> list[Signature]:
    """Output S(d): inputs that carry dim d at full size split it, inputs that broadcast it stay B."""
    r = len(out_shape)
    sigs = []
    for d in range(r):
        ins = []
        for m in metas:
            k = d - (r - len(m.shape))
            ins.append(S(k) if k >= 0 and m.shape[k] == out_shape[d] else B)
        sigs.append(sig(ins, S(d)))
    return sigs


def _binary(name: str, fn: Callable, partials: list[Signature], flops_per: int = 1) -> OpDef:
    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        need_inputs(name, ins, (2,))
        a, b = ins
        dtype = result_dtype(a, b)
        if name == "div":
            dtype = float_dtype(dtype)
        return [TensorMeta(broadcast_shape(name, a.shape, b.shape), dtype)]

    def signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
        out = infer(ins, attrs)[0]
        return broadcast_splits(ins, out.shape) + extremes_in_float(partials, out.dtype)

    def kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
        return (fn(xs[0], xs[1]),)

    def flops(ins, outs, attrs) -> int:
        return flops_per * outs[0].numel

    return OpDef(name, infer, signatures, kernel, flops=flops, doc=f"torch.{fn.__name__} with broadcasting")


register(_binary("add", torch.add, [
    sig([PSUM, PSUM], PSUM),
    sig([PMAX, B], PMAX), sig([B, PMAX], PMAX),  # max_i(a_i) + b = max_i(a_i + b)
    sig([PMIN, B], PMIN), sig([B, PMIN], PMIN),
]))
register(_binary("sub", torch.sub, [
    sig([PSUM, PSUM], PSUM),
    sig([PMAX, B], PMAX), sig([PMIN, B], PMIN),
    sig([B, PMAX], PMIN), sig([B, PMIN], PMAX),  # b - max_i(a_i) = min_i(b - a_i)
]))
register(_binary("mul", torch.mul, [sig([PSUM, B], PSUM), sig([B, PSUM], PSUM)]))
register(_binary("div", torch.div, [sig([PSUM, B], PSUM)]))

# ---- unary ----------------------------------------------------------------------------------

_MONOTONE = [sig([PMAX], PMAX), sig([PMIN], PMIN)]


def _unary(name: str, fn: Callable, partials: list[Signature], flops_per: int, to_float: bool,
           doc: str, check: Callable[[dict], None] | None = None, arithmetic: bool = False) -> OpDef:
    """``arithmetic``: the op computes with its P(max)/P(min) values (neg), so they need a float dtype."""
    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        need_inputs(name, ins, (1,))
        if check is not None:
            check(attrs)
        x = ins[0]
        return [TensorMeta(x.shape, float_dtype(x.dtype) if to_float else x.dtype)]

    def signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
        kept = extremes_in_float(partials, infer(ins, attrs)[0].dtype) if arithmetic else partials
        return [sig([S(d)], S(d)) for d in range(len(ins[0].shape))] + kept

    def kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
        return (fn(xs[0], attrs),)

    def flops(ins, outs, attrs) -> int:
        return flops_per * numel(ins[0].shape)

    return OpDef(name, infer, signatures, kernel, flops=flops, doc=doc)


def _gelu_check(attrs: dict) -> None:
    approximate = attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        fail("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}")


def _gelu(x: torch.Tensor, attrs: dict) -> torch.Tensor:
    return F.gelu(x, approximate=attrs.get("approximate", "none"))


register(_unary("neg", lambda x, a: torch.neg(x), [sig([PSUM], PSUM), sig([PMAX], PMIN), sig([PMIN], PMAX)],
                1, False, "-x; swaps P(max) and P(min)", arithmetic=True))
register(_unary("relu", lambda x, a: torch.relu(x), _MONOTONE, 1, False, "max(x, 0)"))
register(_unary("tanh", lambda x, a: torch.tanh(x), _MONOTONE, 4, True, "tanh(x)"))
register(_unary("exp", lambda x, a: torch.exp(x), _MONOTONE, 4, True, "e^x"))
register(_unary("gelu", _gelu, [], 8, True, "x * Phi(x) (attr approximate: 'none' | 'tanh'); not monotone",
                _gelu_check))
