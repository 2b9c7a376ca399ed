"""Reductions by dims: a split on a kept dim stays a split; a split on a reduced dim becomes a partial
(``sum`` -> P, ``amax`` -> P(max), ``amin`` -> P(min)); ``sum`` also passes P. Scans and selections
along a dim (cumsum, softmax, sort, topk, argmax) split only the other dims."""

from __future__ import annotations

from ...sbp import Partial
from ..registry import Signature, TensorMeta
from ._common import B, P, S, arg, dims_arg, norm_dim, sig

PARTIAL_OF = {"aten.sum.dim_IntList": P, "aten.sum.default": P, "aten.amax.default": Partial("max"),
              "aten.amin.default": Partial("min")}
DIMS_POS = {"aten.sum.dim_IntList": 1, "aten.amax.default": 1, "aten.amin.default": 1, "aten.sum.default": 99,
            "aten.argmax.default": 1, "aten.argmin.default": 1, "aten.any.dim": 1, "aten.any.dims": 1,
            "aten.all.dim": 1, "aten.prod.dim_int": 1, "aten.max.dim": 1, "aten.min.dim": 1}


def reduce_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    x = ins[0]
    nd = len(x.shape)
    dims = dims_arg(attrs, DIMS_POS.get(name, 1), "dim", nd)
    keep = bool(arg(attrs, 2, "keepdim", False))
    partial = PARTIAL_OF.get(name)
    sigs = []
    for d in range(nd):
        if x.shape[d] <= 1:
            continue
        if d in dims:
            if partial is not None:
                sigs.append(sig([S(d)], [partial] * len(outs)))
            continue
        od = d if keep else d - sum(1 for r in dims if r < d)
        sigs.append(sig([S(d)], [S(od)] * len(outs)))
    if partial == P:
        sigs.append(sig([P], [P]))
    return sigs


def along_dim_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict,
                         dim_pos: int = 1, linear_in: int | None = None) -> list[Signature]:
    """Ops computing along one dim (every input and output the same rank): split any other dim.
    ``linear_in``: the input the op is linear in (P there, B elsewhere, gives P)."""
    nd = len(ins[0].shape)
    dim = norm_dim(int(arg(attrs, dim_pos, "dim", -1)), max(nd, 1))
    sigs = [sig([S(d)] * len(ins), [S(d)] * len(outs))
            for d in range(nd) if d != dim and ins[0].shape[d] > 1
            and all(len(m.shape) == nd and m.shape[d] == ins[0].shape[d] for m in ins)
            and all(len(o.shape) == nd for o in outs)]
    if linear_in is not None:
        sigs.append(sig([P if i == linear_in else B for i in range(len(ins))], [P] * len(outs)))
    return sigs


def histc_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    """histc(x, bins, min, max): with a fixed range, the histograms of the pieces add up (any split
    gives P); min == max (both 0 by default) takes the range from the data, which no piece knows."""
    if arg(attrs, 2, "min", 0) == arg(attrs, 3, "max", 0):
        return []
    return [sig([S(d)], [P]) for d in range(len(ins[0].shape)) if ins[0].shape[d] > 1]
