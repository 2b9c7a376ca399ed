"""What every family rule needs: the call's arguments by position or keyword, and signature spelling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...sbp import B, P, S, SbpParallel
from ..registry import LocalContext, Signature, TensorMeta
from .calls import Slot


def arg(attrs: dict, pos: int, key: str, default: Any = None) -> Any:
    """Argument ``pos`` of the call (or keyword ``key``), as captured."""
    args = attrs.get("args", ())
    if len(args) > pos:
        return args[pos]
    return dict(attrs.get("kwargs", ())).get(key, default)


def slot_of(attrs: dict, pos: int, key: str) -> int | None:
    """Which tensor input argument ``pos`` is, or None when it is not a tensor (None, a number)."""
    a = arg(attrs, pos, key)
    return a.index if isinstance(a, Slot) else None


def with_arg(attrs: dict, pos: int, key: str, value: Any) -> dict:
    """The attrs with argument ``pos`` (or keyword ``key``) replaced."""
    args = list(attrs.get("args", ()))
    if len(args) > pos:
        args[pos] = value
        return {**attrs, "args": tuple(args)}
    kw = dict(attrs.get("kwargs", ()))
    kw[key] = value
    return {**attrs, "kwargs": tuple(kw.items())}


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def dims_arg(attrs: dict, pos: int, key: str, ndim: int) -> tuple[int, ...]:
    """A dim or dim-list argument, normalised; None or [] means every dim (as torch reads it)."""
    d = arg(attrs, pos, key)
    if d is None or d == ():
        return tuple(range(ndim))
    if isinstance(d, int):
        d = (d,)
    return tuple(sorted(norm_dim(x, ndim) for x in d))


def sig(ins: Sequence[SbpParallel], outs: Sequence[SbpParallel]) -> Signature:
    return Signature(tuple(ins), tuple(outs))


def all_p(n_in: int, n_out: int) -> Signature:
    """The op is linear in all its tensor inputs together: partial sums in, partial sums out."""
    return sig([P] * n_in, [P] * n_out)


def local_shape(block) -> tuple[int, ...]:
    return tuple(e - s for s, e in block)


def sized(pos: int, key: str, out: int = 0):
    """A localize for ops with a size argument equal to an output's shape (view, expand, zeros, ...)."""
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        return with_arg(attrs, pos, key, local_shape(ctx.out_blocks[out]))
    return localize


def splittable(m: TensorMeta, d: int) -> bool:
    return 0 <= d < len(m.shape) and m.shape[d] > 1


__all__ = ["B", "P", "S", "Signature", "TensorMeta", "arg", "slot_of", "with_arg", "norm_dim", "dims_arg", "sig",
           "all_p", "local_shape", "sized", "splittable"]
