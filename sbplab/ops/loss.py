"""cross_entropy: the mean negative log-likelihood of integer targets, the usual training loss.

Under data parallelism each rank holds some rows of logits and targets. Each computes the sum of
its rows' losses divided by the GLOBAL row count (``localize`` tells it), so the ranks' results
are addends of the exact mean: ``S(0), S(0) -> P``. The kernel is ``aten/cross_entropy_rows.py``'s, so
the backward torch's autograd gives is the fused one (one buffer the size of the logits).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sbp import S
from ._util import PSUM, fail, need_float, need_inputs, need_int, sig
from .aten.cross_entropy_rows import cross_entropy_rows
from .registry import LocalContext, OpDef, Signature, TensorMeta, register


def _ce_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("cross_entropy", ins, (2,))
    logits, target = ins
    need_float("cross_entropy", logits, "logits")
    need_int("cross_entropy", target, "target")
    if len(logits.shape) != 2 or target.shape != logits.shape[:1]:
        fail("cross_entropy", f"needs logits (N, C) and target (N,), got shapes {logits.shape} and "
                              f"{target.shape}")
    return [TensorMeta((), logits.dtype)]


def _ce_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    return [sig([S(0), S(0)], PSUM)]


def _ce_kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    logits, target = xs
    count = attrs.get("count") or logits.shape[0]
    return (cross_entropy_rows(logits, target).sum() / count,)  # torch's backward of it: the fused one


def _ce_localize(attrs: dict, ctx: LocalContext) -> dict:
    return {**attrs, "count": ctx.in_metas[0].shape[0]}


def _ce_flops(ins, outs, attrs) -> int:
    n, c = ins[0].shape
    return 5 * n * c


register(OpDef("cross_entropy", _ce_infer, _ce_signatures, _ce_kernel, flops=_ce_flops,
               localize=_ce_localize, doc="mean cross entropy of logits (N, C) against int targets (N,)"))
