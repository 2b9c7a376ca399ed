"""FLOPs by formula, per family: torch's own counter formulas read on shapes, no kernel run.

``torch.utils.flop_counter`` counts an op by running it under ``FlopCounterMode`` and handing its
arguments to the formula registered for it (``mm_flop``, ``bmm_flop``, ``sdpa_flop_count``...),
which reads only their shapes. Deduction asks for the FLOPs of every signature's local shapes: a
32-layer Llama asks about 1800 distinct questions, and entering the counter and running a meta kernel
cost about a millisecond each. So for the families whose formula is known, the same formula is
called here on the shapes directly:

- the matmul family (mm, bmm, addmm, baddbmm), convolution and attention (sbplab's SDPA op forward
  and backward, ATen's memory-efficient SDPA forward): the counter's formula for the op, as the
  counter calls it (these ops are not decomposed first: they have no CompositeImplicitAutograd kernel);
- pointwise ops: zero, as the counter gives (its table has no elementwise op; a composite pointwise
  op, ``silu_backward``, decomposes into more pointwise ops);

and every other op still goes through the counter (``opdef._flops``). ``counted_by_torch()`` turns
the formulas off, so a test compares both on every op of the real-model corpus.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from functools import lru_cache

import torch

from ...shortcut import Shortcut
from ..registry import TensorMeta
from .calls import fill, overload

FLOP_FORMULAS = Shortcut()  # off inside counted_by_torch()

# ops whose counter formula is read on shapes here (each checked against the counter by a test)
# (the fused kernels' other formulas read more than shapes: those ops go through the counter)
FORMULA_OPS = frozenset({
    "aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default",
    "aten.convolution.default", "aten._scaled_dot_product_efficient_attention.default",
    "sbplab.scaled_dot_product_attention.default", "sbplab.scaled_dot_product_attention_backward.default",
})


def counted_by_torch() -> contextlib.AbstractContextManager[None]:
    """Inside this block every op's FLOPs come from running it under torch's ``FlopCounterMode`` (the
    reference the formulas are tested against). Cached answers are kept: clear ``opdef._flops``."""
    return FLOP_FORMULAS.off()


@lru_cache(maxsize=1024)
def _formula(name: str) -> Callable | None:
    """The counter's raw formula for ``name`` (shapes in, FLOPs out), or None: not a formula op."""
    if name not in FORMULA_OPS:
        return None
    from torch.utils.flop_counter import flop_registry

    try:
        op = overload(name)
    except Exception:  # noqa: BLE001  (a library op not loaded here: the counter decides)
        return None
    f = flop_registry.get(op.overloadpacket)
    return getattr(f, "__wrapped__", None)  # register_flop_formula wraps it in shape_wrapper


def formula_flops(name: str, family: str, metas: Sequence[TensorMeta], attrs: dict,
                  outs: Callable[[], Sequence[TensorMeta]]) -> int | None:
    """FLOPs of op ``name`` (rule family ``family``) on inputs ``metas`` by formula, or None where only
    the counter knows. ``outs()`` gives the output metas (convolution's formula reads its output shape)."""
    if not FLOP_FORMULAS.on:
        return None
    if family == "pointwise":
        return 0
    f = _formula(name)
    if f is None:
        return None
    shapes = [torch.Size(m.shape) for m in metas]
    args = fill(attrs["args"], shapes, None)
    kwargs = dict(fill(attrs.get("kwargs", ()), shapes, None))
    out = outs()
    out_shape = torch.Size(out[0].shape) if len(out) == 1 else tuple(torch.Size(m.shape) for m in out)
    return int(f(*args, out_shape=out_shape, **kwargs))
