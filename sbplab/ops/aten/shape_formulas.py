"""Output shapes by formula for the commonest ATen ops, so listing signatures runs no meta kernel.

Listing an op's n-D signatures checks each candidate by inferring every rank's local output shapes
from its local input shapes (``registry._valid_on_ranks``). Inferring by running the op on meta
tensors costs a tenth of a millisecond or more (a Python reference implementation behind the
dispatcher), and a 32-layer Llama's deduction infers about 1800 distinct local shapes, most of them
for a handful of ops whose output shape is plain arithmetic: broadcasting (``add``, ``mul``...),
``mm``, ``addmm``, views and reshapes to a given size, ``transpose``, ``t``, ``unsqueeze``, ``expand``
and ``sum`` over given dims. Those are computed here. Only valid calls are answered: anything a
formula does not cover, or a call torch would refuse (shapes that do not broadcast, a size whose
element count differs...), returns None and the meta kernel runs, so an error is torch's own.

Output dtypes: a view or matmul keeps its input's; a broadcasting op's or a sum's comes from running
it once on all-ones shapes of the same ranks (type promotion reads ranks and dtypes, not sizes).
``kernels_only()`` turns the formulas off: a test checks them against the meta kernels on every op of
the real-model corpus, and a deduction with and without them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

from ...shortcut import Shortcut
from ..registry import TensorMeta
from ._common import arg
from .family_pointwise import POINTWISE_OPS

SHAPE_FORMULAS = Shortcut()  # off inside kernels_only()

Shapes = list[tuple[int, ...]]

# every op declared pointwise but those whose output is their first input's shape whatever the others' (a
# mask broadcast into it), or whose validity depends on more than shapes (clamp needs a bound; a dropout's
# backward a scale): those run the kernel
BROADCAST = frozenset(POINTWISE_OPS) - {"aten.masked_fill.Scalar", "aten.masked_fill.Tensor",
                                         "aten.clamp.default", "aten.native_dropout_backward.default"}


def kernels_only() -> contextlib.AbstractContextManager[None]:
    """Inside this block every output shape comes from the meta kernel (the reference the formulas are
    tested against). Cached answers are kept: clear ``opdef._infer``."""
    return SHAPE_FORMULAS.off()


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """torch's broadcasting of ``shapes``, or None where they do not broadcast."""
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s, n - len(s)):
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    return None
                out[i] = d
    return tuple(out)


def _sized(size, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A view or reshape of ``shape`` to ``size`` (one entry may be -1), or None: not a valid view size."""
    if not isinstance(size, tuple) or not all(type(d) is int for d in size):
        return None
    total = math.prod(shape)
    if total == 0 or any(d < -1 or d == 0 for d in size) or size.count(-1) > 1:
        return None  # empty tensors and zero-size dims: the kernel decides
    if -1 in size:
        known = -math.prod(size)
        if total % known:
            return None
        size = tuple(total // known if d == -1 else d for d in size)
    return size if math.prod(size) == total else None


def _dim(d, ndim: int) -> int | None:
    if type(d) is not int or not -max(ndim, 1) <= d < max(ndim, 1):
        return None
    return d + ndim if d < 0 else d


def _mm(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    (a, b) = shapes
    if len(a) != 2 or len(b) != 2 or a[1] != b[0] or metas[0].dtype != metas[1].dtype:
        return None
    return [(a[0], b[1])]


def _addmm(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    out = _mm(shapes[1:], metas[1:], attrs)
    if out is None or len(shapes[0]) > 2 or metas[0].dtype != metas[1].dtype or _broadcast([shapes[0], out[0]]) != out[0]:
        return None
    return out


def _sum(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    s, dims, keep = shapes[0], arg(attrs, 1, "dim"), arg(attrs, 2, "keepdim", False)
    if not isinstance(dims, tuple) or not dims or type(keep) is not bool:
        return None  # no dims (every dim, or an error): the kernel decides
    norm = [_dim(d, len(s)) for d in dims]
    if None in norm or len(set(norm)) != len(norm) or not s:
        return None
    return [tuple(1 if i in norm else d for i, d in enumerate(s)) if keep else
            tuple(d for i, d in enumerate(s) if i not in norm)]


def _view(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    out = _sized(arg(attrs, 1, "size"), shapes[0])
    return None if out is None else [out]


def _transpose(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    s = shapes[0]
    a, b = _dim(arg(attrs, 1, "dim0"), len(s)), _dim(arg(attrs, 2, "dim1"), len(s))
    if a is None or b is None or not s:
        return None
    out = list(s)
    out[a], out[b] = out[b], out[a]
    return [tuple(out)]


def _t(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    s = shapes[0]
    return [s[::-1]] if len(s) <= 2 else None


def _unsqueeze(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    s = shapes[0]
    d = _dim(arg(attrs, 1, "dim"), len(s) + 1)
    return None if d is None else [s[:d] + (1,) + s[d:]]


def _expand(shapes: Shapes, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    s, size = shapes[0], arg(attrs, 1, "size")
    if not isinstance(size, tuple) or not all(type(d) is int for d in size) or len(size) < len(s):
        return None
    lead = len(size) - len(s)
    if any(d < 0 for d in size[:lead]):
        return None
    out = list(size[:lead])
    for have, want in zip(s, size[lead:]):
        if want == -1 or want == have:
            out.append(have)
        elif have == 1 and want >= 0:
            out.append(want)
        else:
            return None
    return [tuple(out)]


FORMULAS: dict[str, Callable[[Shapes, Sequence[TensorMeta], dict], Shapes | None]] = {
    "aten.mm.default": _mm, "aten.addmm.default": _addmm, "aten.sum.dim_IntList": _sum,
    "aten.view.default": _view, "aten._unsafe_view.default": _view, "aten.reshape.default": _view,
    "aten.transpose.int": _transpose, "aten.t.default": _t, "aten.unsqueeze.default": _unsqueeze,
    "aten.expand.default": _expand,
}


PROMOTES = frozenset({"aten.sum.dim_IntList"})  # a formula op whose dtype may change (integers sum as int64)


def same_dtype(name: str) -> bool:
    """Whether op ``name``'s output dtype is its first input's (views, matmuls), as opposed to a
    broadcasting op's promoted one or a sum's (read off a run on all-ones shapes)."""
    return name in FORMULAS and name not in PROMOTES


def output_shapes(name: str, metas: Sequence[TensorMeta], attrs: dict) -> Shapes | None:
    """The output shapes of op ``name`` on inputs ``metas``, or None: run the meta kernel."""
    if not SHAPE_FORMULAS.on or "op" in attrs:  # a localized call that swaps the overload: the kernel decides
        return None
    shapes = [m.shape for m in metas]
    if name in BROADCAST:
        out = _broadcast(shapes)
        return None if out is None else [out]
    f = FORMULAS.get(name)
    return None if f is None else f(shapes, metas, attrs)
