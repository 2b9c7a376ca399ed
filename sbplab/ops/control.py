"""Ordering ops: ``after(x, token)`` is ``x``, made available only once ``token`` exists.

A dataflow runtime fires an op as soon as its inputs are ready. Activation recomputation needs the
opposite: a layer's forward, cloned into the backward, must wait until the backward reaches that
layer, although its inputs (the layer's input, its parameters) were ready since the forward. The
clones read their inputs through ``after(input, gradient arriving at the layer)``: no value changes,
only the order. Every SBP of ``x`` passes through unchanged with the token in any layout, so it never
moves data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sbp import B, P, S
from .opkit import check_arity, define
from .registry import OpDef, Signature, TensorMeta


def _infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("after", ins, 2)
    return [ins[0]]


def _sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
    xs = [B, P, *(S(d) for d in range(len(ins[0].shape)))]
    ts = [B, P, *(S(d) for d in range(len(ins[1].shape)))]
    return [Signature((x, t), (x,)) for x in xs for t in ts]


def _after(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    return (xs[0],)


AFTER = define(OpDef("after", _infer, _sigs, _after,
                     doc="x, once token exists (orders a recomputed layer after its backward starts)."))
