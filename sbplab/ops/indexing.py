"""embedding and gather: ops that pick rows or elements by integer index.

Picking commutes with every reduction of the table, so a partial table (P, P(max), P(min)) with
broadcast indices gives the same partial output. The model-parallel embedding splits the
vocabulary: ``ids B, weight S(0) -> P``; each rank looks up the ids that fall in its rows and
writes zeros for the rest, so the sum over ranks is the full lookup. ``localize`` hands each rank
the global row range of its weight shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..sbp import B, S
from ._util import PARTIALS, PSUM, fail, need_inputs, need_int, norm_dim, sig
from .registry import LocalContext, OpDef, Signature, TensorMeta, register

# ---- embedding ------------------------------------------------------------------------------


def _emb_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("embedding", ins, (2,))
    ids, w = ins
    need_int("embedding", ids, "ids")
    if len(w.shape) != 2:
        fail("embedding", f"weight must be (vocab, dim), got shape {w.shape} (ids {ids.shape})")
    return [TensorMeta(ids.shape + (w.shape[1],), w.dtype)]


def _emb_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    r = len(ins[0].shape)
    sigs = [sig([S(d), B], S(d)) for d in range(r)]  # data parallel over the ids
    sigs.append(sig([B, S(1)], S(r)))  # each rank holds some embedding features
    sigs.append(sig([B, S(0)], PSUM))  # vocab parallel: zeros for ids outside the rank's rows
    return sigs + [sig([B, p], p) for p in PARTIALS]


def _emb_kernel(xs: Sequence[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    ids, w = xs
    rows = attrs.get("vocab_range")
    if rows is None:
        return (F.embedding(ids, w),)
    start, stop = rows
    mine = (ids >= start) & (ids < stop)
    local = torch.where(mine, ids - start, torch.zeros_like(ids))
    out = F.embedding(local, w)
    return (torch.where(mine.unsqueeze(-1), out, torch.zeros_like(out)),)


def _emb_localize(attrs: dict, ctx: LocalContext) -> dict:
    rows = ctx.in_blocks[1][0]
    if rows == (0, ctx.in_metas[1].shape[0]):
        return attrs
    return {**attrs, "vocab_range": rows}


register(OpDef("embedding", _emb_infer, _emb_signatures, _emb_kernel, localize=_emb_localize,
               doc="weight[ids]: ids int (...), weight (vocab, dim) -> (..., dim)"))

# ---- gather ---------------------------------------------------------------------------------


def _gather_infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
    need_inputs("gather", ins, (2,))
    x, index = ins
    need_int("gather", index, "index")
    r = len(x.shape)
    if r == 0 or len(index.shape) != r:
        fail("gather", f"x {x.shape} and index {index.shape} must have the same number of dims (>= 1)")
    if "dim" not in attrs:
        fail("gather", f"needs attr dim (an int in -{r}..{r - 1})")
    d = norm_dim("gather", attrs["dim"], x.shape)
    for e in range(r):
        if e != d and index.shape[e] > x.shape[e]:
            fail("gather", f"index {index.shape} is larger than x {x.shape} at dim {e}; outside dim {d} "
                           f"index sizes must be <= x sizes")
    return [TensorMeta(index.shape, x.dtype)]


def _gather_signatures(ins: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    x, index = ins
    r = len(x.shape)
    d = norm_dim("gather", attrs["dim"], x.shape)
    # out[i][j] = x[i][index[i][j]] (d = 1): a split of rows needs the same rows of x and index,
    # which holds only where both have the same size there
    sigs = [sig([S(e), S(e)], S(e)) for e in range(r) if e != d and x.shape[e] == index.shape[e]]
    sigs.append(sig([B, S(d)], S(d)))  # each rank picks its share of the positions along dim
    return sigs + [sig([p, B], p) for p in PARTIALS]


register(OpDef("gather", _gather_infer, _gather_signatures,
               lambda xs, attrs: (torch.gather(xs[0], attrs["dim"], xs[1]),),
               doc="torch.gather(x, dim, index): inputs x, index; attr dim"))
