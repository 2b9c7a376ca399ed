"""Small helpers the op files share: error messages, dim normalisation, signature shorthands.

Every op file reads like a table of rules; these helpers keep the rules short without hiding them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import torch

from ..errors import OpError
from ..layout import numel  # noqa: F401  (the op files' shorthand, defined once)
from ..sbp import B, Partial, SbpParallel
from .registry import Signature, TensorMeta

PSUM = Partial("sum")
PMAX = Partial("max")
PMIN = Partial("min")
PARTIALS = (PSUM, PMAX, PMIN)


def fail(op: str, msg: str) -> NoReturn:
    """Raise the ValueError every ``infer`` uses: it starts with the op's name."""
    raise OpError(f"{op}: {msg}")


def sig(ins: Sequence[SbpParallel], outs: Sequence[SbpParallel] | SbpParallel) -> Signature:
    """``sig([S(0), B], S(0))`` reads like the paper's ``S(0), B -> S(0)``."""
    if not isinstance(outs, (list, tuple)):
        outs = (outs,)
    return Signature(tuple(ins), tuple(outs))


def extremes_in_float(sigs: list[Signature], dtype: torch.dtype) -> list[Signature]:
    """``sigs`` without their P(max)/P(min) ones unless the op computes in floating point: ranks without a
    piece of an integer P(max) hold iinfo's extremes in place of -inf (``layout.partial_fill``), and
    adding to or negating them wraps around instead of staying the identity."""
    if dtype.is_floating_point:
        return sigs
    return [s for s in sigs if not any(isinstance(x, Partial) and x.op != "sum" for x in (*s.inputs, *s.outputs))]


def same_all(n_in: int, x: SbpParallel, out: SbpParallel | None = None) -> Signature:
    """Every input ``x``, output ``out`` (default ``x``): e.g. concat's ``P, P, P -> P``."""
    return sig([x] * n_in, out if out is not None else x)


def selection_partials(n_in: int) -> list[Signature]:
    """Ops that only move or pick elements commute with every reduction: P->P, P(max)->P(max)...."""
    return [same_all(n_in, p) for p in PARTIALS]


def norm_dim(op: str, dim: int, shape: Sequence[int], what: str = "dim") -> int:
    """A dim in ``-ndim..ndim-1`` of a tensor of ``shape`` made non-negative, or a ValueError."""
    ndim = len(shape)
    if isinstance(dim, bool) or not isinstance(dim, int):
        fail(op, f"{what} must be an int, got {dim!r}")
    if ndim == 0:
        fail(op, f"{what}={dim}: a tensor of shape () (a scalar) has no dims to name")
    if not -ndim <= dim < ndim:
        fail(op, f"{what}={dim} is out of range for a tensor of shape {tuple(shape)}; "
                 f"valid dims are {-ndim}..{ndim - 1}")
    return dim % ndim


def norm_dims(op: str, dims, shape: Sequence[int]) -> tuple[int, ...]:
    """A reduction's dims: None or () means every dim; duplicates are an error."""
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        return tuple(range(len(shape)))
    if isinstance(dims, int):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)):
        fail(op, f"dims must be an int, a tuple of ints or None, got {dims!r}")
    out = tuple(norm_dim(op, d, shape) for d in dims)
    if len(set(out)) != len(out):
        fail(op, f"dims {tuple(dims)} name a dim twice (tensor shape {tuple(shape)})")
    return tuple(sorted(out))


def pair(op: str, v, what: str) -> tuple[int, int]:
    """An int or a pair of ints (conv's stride, padding, dilation) as a pair."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return (int(v[0]), int(v[1]))
    fail(op, f"{what} must be an int or a pair of ints, got {v!r}")


def need_inputs(op: str, metas: Sequence[TensorMeta], counts: Sequence[int]) -> None:
    if len(metas) not in counts:
        want = " or ".join(str(c) for c in counts)
        fail(op, f"takes {want} inputs, got {len(metas)} (shapes {[m.shape for m in metas]})")


def need_int(op: str, m: TensorMeta, what: str) -> None:
    if m.dtype.is_floating_point or m.dtype.is_complex or m.dtype == torch.bool:
        fail(op, f"{what} must be an integer tensor, got {m.dtype} of shape {m.shape}")


def need_float(op: str, m: TensorMeta, what: str) -> None:
    if not m.dtype.is_floating_point:
        fail(op, f"{what} must be a floating point tensor, got {m.dtype} of shape {m.shape}")


def float_dtype(d: torch.dtype) -> torch.dtype:
    """What a transcendental op returns: floats keep their dtype, ints become the default float."""
    return d if d.is_floating_point else torch.get_default_dtype()


def all_b(n_in: int, n_out: int = 1) -> Signature:
    return Signature(tuple(B for _ in range(n_in)), tuple(B for _ in range(n_out)))
