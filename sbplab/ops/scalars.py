"""Ops with a Python number: a constant, ``x * factor``, ``x + value``, and micro-batch accumulation.

``fill`` makes the loss's gradient seed (1, or 1/M over M micro-batches) and a parameter's zero gradient
when the loss does not read it; ``acc`` sums a gradient (and the loss) over the micro-batches of a step;
``scale`` and ``add_scalar`` are what ``x * 2.0`` and ``x + 1.0`` become in a traced or hand-built
graph. Both front doors use them, so they live apart from any one of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .opkit import check_arity, define, ew_flops, linear_in, meta_like, same_split
from .registry import OpDef, TensorMeta


def _fill_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("fill", ins, 0)
    return [TensorMeta(tuple(a["shape"]), a.get("dtype", torch.float32))]


FILL = define(OpDef(
    "fill", _fill_infer, lambda ins, a: [],
    lambda xs, a: (torch.full(tuple(a["shape"]), a["value"], dtype=a.get("dtype", torch.float32)),),
    doc="A constant tensor (the seed 1 of the loss gradient). Broadcast only.",
))


def _unary_infer(name: str):
    def infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
        check_arity(name, ins, 1)
        return [meta_like(ins[0])]
    return infer


SCALE = define(OpDef(
    "scale", _unary_infer("scale"),
    lambda ins, a: same_split(1, 1, range(len(ins[0].shape))) + [linear_in(1, 1, 0)],
    lambda xs, a: (xs[0] * a["factor"],), ew_flops(1),
    doc="x * factor for a Python number factor; linear, so P stays P.",
))

ADD_SCALAR = define(OpDef(
    "add_scalar", _unary_infer("add_scalar"),
    lambda ins, a: same_split(1, 1, range(len(ins[0].shape))),
    lambda xs, a: (xs[0] + a["value"],), ew_flops(1),
    doc="x + value for a Python number; not linear, so no P.",
))

ACC = define(OpDef(
    "acc", _unary_infer("acc"),
    lambda ins, a: same_split(1, 1, range(len(ins[0].shape))) + [linear_in(1, 1, 0)],
    lambda xs, a: (xs[0] * a.get("scale", 1.0),), ew_flops(1),
    doc="Micro-batch accumulation (OneFlow's acc): the output is scale * the sum of the input over "
        "all micro-batches of a step; the kernel is one micro-batch's term.",
))
