"""Eager dispatch: pick an op's signature the way OneFlow does, box the inputs, run every shard.

Inputs keep their SBP where a signature accepts them; otherwise the cheapest signature wins,
counting the estimated time of the boxing it needs (then bytes, then the number of steps, then the
per-rank FLOPs, so that among free choices the one that splits the work is preferred). The user
can force a signature or an output SBP. Decisions are cached per (op, shapes, attrs, SBPs,
placement), so a repeated op costs a dictionary lookup plus its kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..boxing import plan_boxing
from ..cluster import Cluster
from ..ops.registry import (
    NdSignature,
    TensorMeta,
    _freeze,
    get_op,
    local_context,
    nd_signatures,
)
from ..placement import Placement
from ..sbp import NdSbp, as_nd_sbp, fmt_sbp, parse_sbp
from .records import Candidate


class SignatureError(ValueError):
    """No signature of an op accepts what the user asked for."""


@dataclass
class Decision:
    """Everything dispatch decided for one (op, inputs) situation; cached and reused."""

    signature: NdSignature
    candidates: list[Candidate]  # cheapest first; [0] is the chosen one
    input_plans: list  # BoxingPlan per input (possibly empty plans)
    out_metas: list[TensorMeta]
    local_attrs: dict[int, dict]  # rank -> attrs for that shard
    forced: str


_DEFAULT_CLUSTER: list[Cluster] = []


def default_cluster() -> Cluster:
    if not _DEFAULT_CLUSTER:
        _DEFAULT_CLUSTER.append(Cluster.cpu_box())
    return _DEFAULT_CLUSTER[0]


def set_default_cluster(cluster: Cluster) -> None:
    """The cluster model used to cost eager boxing (``sl.Cluster.h100_node()`` etc.)."""
    _DEFAULT_CLUSTER[:] = [cluster]
    _CACHE.clear()


def _parse_signature(text: str | NdSignature, n_in: int, mesh_ndim: int, op: str) -> NdSignature:
    if isinstance(text, NdSignature):
        return text
    if "->" not in text:
        raise SignatureError(f"{op}: a signature is written 'in0, in1 -> out', got {text!r}")
    lhs, rhs = text.split("->")
    if mesh_ndim == 1:
        ins = tuple((x,) for x in parse_sbp(lhs))
        outs = tuple((x,) for x in parse_sbp(rhs))
    else:
        raise SignatureError(f"{op}: on a {mesh_ndim}-D mesh pass an NdSignature or an output sbp")
    if len(ins) != n_in:
        raise SignatureError(f"{op}: signature {text!r} has {len(ins)} inputs, the op has {n_in}")
    return NdSignature(ins, outs)


def _list_valid(sigs: Sequence[NdSignature], limit: int = 12) -> str:
    body = "; ".join(str(s) for s in sigs[:limit])
    return body + (f"; ... ({len(sigs) - limit} more)" if len(sigs) > limit else "")


def _candidate(sig: NdSignature, shapes, dtypes, in_sbps, placement, cluster, op, in_metas, attrs):
    plans = [plan_boxing(shape, src, dst, placement, dtype=dt, cluster=cluster)
             for shape, dt, src, dst in zip(shapes, dtypes, in_sbps, sig.inputs)]
    rank0 = placement.rank_list[0]
    ctx = local_context(op, in_metas, attrs, sig, placement, rank0)
    local_metas = [TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ctx.in_blocks, in_metas)]
    local_out = op.infer(local_metas, op.localize(dict(attrs), ctx))
    cand = Candidate(sig, sum(int(p.total_bytes) for p in plans), sum(float(p.time_s) for p in plans),
                     sum(len(p.steps) for p in plans), int(op.flops(local_metas, local_out, attrs)))
    return cand, plans


def decide(op_name: str, in_metas: Sequence[TensorMeta], in_sbps: Sequence[NdSbp], attrs: dict,
           placement: Placement, signature: str | NdSignature | None = None,
           out_sbp: NdSbp | None = None, cluster: Cluster | None = None) -> Decision:
    """Choose the signature for one op call (cached)."""
    cluster = cluster or default_cluster()
    key = (op_name, tuple(in_metas), tuple(in_sbps), _freeze(attrs), placement, str(signature),
           out_sbp, id(cluster))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    op = get_op(op_name)
    valid = nd_signatures(op, in_metas, attrs, placement)
    shapes = [m.shape for m in in_metas]
    dtypes = [m.dtype for m in in_metas]
    forced = ""
    pool = valid
    if signature is not None:
        want = _parse_signature(signature, len(in_metas), placement.ndim, op_name)
        if want not in valid:
            raise SignatureError(
                f"{op_name}: signature {want} is not valid for inputs "
                f"{', '.join(f'{tuple(m.shape)}' for m in in_metas)} on a mesh of shape {placement.shape}. "
                f"Valid signatures: {_list_valid(valid)}")
        pool, forced = [want], "signature"
    elif out_sbp is not None:
        pool = [s for s in valid if s.outputs[0] == out_sbp]
        forced = "output sbp"
        if not pool:
            outs = sorted({fmt_sbp(s.outputs[0]) for s in valid})
            raise SignatureError(
                f"{op_name}: no signature produces output SBP {fmt_sbp(out_sbp)}; "
                f"possible output SBPs: {', '.join(outs)} (or convert afterwards with .to_global)")
    scored = [_candidate(s, shapes, dtypes, in_sbps, placement, cluster, op, in_metas, attrs) for s in pool]
    order = sorted(range(len(scored)), key=lambda i: scored[i][0].cost_key())
    best_cand, best_plans = scored[order[0]]
    others = []
    if forced == "signature":  # still show what the free choice would have cost
        others = [_candidate(s, shapes, dtypes, in_sbps, placement, cluster, op, in_metas, attrs)[0]
                  for s in valid if s != best_cand.signature]
        others.sort(key=Candidate.cost_key)
    else:
        others = [scored[i][0] for i in order[1:]]
    local_attrs = {}
    for r in placement.rank_list:
        ctx = local_context(op, in_metas, attrs, best_cand.signature, placement, r)
        local_attrs[r] = op.localize(dict(attrs), ctx)
    dec = Decision(best_cand.signature, [best_cand, *others], best_plans,
                   list(op.infer(in_metas, attrs)), local_attrs, forced)
    _CACHE[key] = dec
    return dec


_CACHE: dict[tuple, Decision] = {}


def normalise_out_sbp(out_sbp, placement: Placement, ndim: int, op: str) -> NdSbp | None:
    if out_sbp is None:
        return None
    return as_nd_sbp(out_sbp, placement.ndim, ndim, what=f"output of {op}")
