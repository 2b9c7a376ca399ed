"""Signatures chosen by hand: deduction where some ops are told which n-D signature to take.

The compiler's strategies speak about tensors (hints); the StrategyEditor also lets people pick an
op's signature from the list ``nd_signatures`` gives. ``deduce_with_choices`` is ``deduce`` with
that one difference: an op with a chosen signature takes it (its inputs are boxed to fit, exactly
as for a deduced choice), every other op is deduced by the compiler's own ``choose``. With no
choices it *is* ``deduce``. A strategy-level op hint in the compiler would make this module a
one-line call; until then it mirrors ``deduce``'s loop, and the tests check both agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..cluster import Cluster
from ..compiler.deduce import Deduction, OpChoice, _check_hints, _source_sbps, choose, deduce
from ..compiler.ir import Graph, GraphError, OpNode
from ..compiler.staging import assign_placements
from ..compiler.strategy import HintError, Strategy
from ..ops.registry import NdSignature, nd_signatures
from ..placement import Placement
from ..sbp import fmt_sbp

HAND = "chosen by hand"


class ChoiceError(HintError):
    """A signature chosen for an op is not one of its valid signatures (on this mesh)."""

    def __init__(self, op: str, message: str) -> None:
        super().__init__(message)
        self.op = op


@dataclass(frozen=True)
class Option:
    """One signature an op may take, with the boxing it would cost given what its producers left."""

    signature: NdSignature
    cost: int  # bytes sent to box inputs (and outputs to a hinted SBP)
    changes: int  # inputs that need any boxing (local slices count)
    blocked: str = ""  # the pin hint this signature contradicts, if any (deduction never takes it)

    @property
    def text(self) -> str:
        return repr(self.signature)


def signatures_of(graph: Graph, op: OpNode, placement: Placement | None = None) -> list[NdSignature]:
    """Every valid n-D signature of ``op`` on its placement (all-B first), as deduction sees them."""
    pl = placement or op.placement
    if pl is None:
        raise GraphError(f"op {op.name!r} has no placement yet; deduce the graph first")
    metas = [graph.tensors[i].meta for i in op.inputs]
    return nd_signatures(op.type, metas, op.attrs, pl)


def _wanted_outputs(d: Deduction, op: OpNode, successor_of: Mapping[str, str]) -> dict[int, tuple]:
    """Outputs that must end in a given SBP: a store hint, or the state an update replaces."""
    want: dict[int, tuple] = {}
    for j, o in enumerate(op.outputs):
        if o in d.store_hints:
            want[j] = (d.store_hints[o][0], op.placement)
        elif o in successor_of:
            old = successor_of[o]
            want[j] = (d.sbp[old], d.placement[old])
    return want


def _pin_conflict(d: Deduction, op: OpNode, sig: NdSignature) -> str:
    """The pin hint ``sig`` contradicts (it reads a pinned tensor another way), or ""."""
    for i, t in enumerate(op.inputs):
        if t in d.store_hints and d.store_hints[t][1].pin and d.store_hints[t][0] != sig.inputs[i]:
            nd, hint = d.store_hints[t]
            return f"{hint.describe()} pins {t!r} to {fmt_sbp(nd)}"
    return ""


def options(d: Deduction, op_name: str) -> list[Option]:
    """The op's signatures priced as deduction prices them: the ones pins allow first, then cheapest
    first (ties: fewer changes), so the first is deduction's own pick."""
    g = d.graph
    op = g.op_by_name[op_name]
    successor_of = {new: old for old, new in g.state_updates.items()}
    have = [d.read_state(t, op.phase, op.stage)[0] for t in op.inputs]
    want = _wanted_outputs(d, op, successor_of)
    out = []
    for sig in signatures_of(g, op):
        cost = changes = 0
        for t, h, w in zip(op.inputs, have, sig.inputs):
            if h != w or d.placement[t] != op.placement:
                changes += 1
                cost += d.cost(t, h, w, d.placement[t], op.placement)
        for j, (w, pl) in want.items():
            cost += d.cost(op.outputs[j], sig.outputs[j], w, op.placement, pl)
        out.append(Option(sig, cost, changes, _pin_conflict(d, op, sig)))
    order = sorted(range(len(out)), key=lambda k: (bool(out[k].blocked), out[k].cost, out[k].changes, k))
    return [out[k] for k in order]


def _pick(d: Deduction, op: OpNode, text: str) -> NdSignature:
    cands = signatures_of(d.graph, op)
    for sig in cands:
        if repr(sig) == text:
            return sig
    valid = "; ".join(repr(s) for s in cands[:12]) + (" ..." if len(cands) > 12 else "")
    raise ChoiceError(op.name, f"op {op.name!r} ({op.type}) has no signature {text!r} on a mesh of shape "
                               f"{op.placement.shape}; valid: {valid}")


def _choose_given(d: Deduction, op: OpNode, sig: NdSignature, successor_of: Mapping[str, str]) -> None:
    """What ``choose`` does after picking, for a signature picked by hand."""
    ranked = options(d, op.name)
    mine = next(o for o in ranked if o.signature == sig)
    if mine.blocked:
        raise HintError(f"op {op.name!r}: the chosen signature {sig} contradicts a hint: {mine.blocked}; pick a "
                        f"signature that reads it that way, or drop the choice")
    best = ranked[0]
    reason = HAND if best.signature == sig else \
        f"{HAND}; deduction would take {best.signature} ({best.cost} B)"
    want = _wanted_outputs(d, op, successor_of)
    if want:
        reason += "; outputs must end as " + ", ".join(f"{op.outputs[j]} {fmt_sbp(w)}" for j, (w, _) in want.items())
    reads = [d.read(op, t, sig.inputs[i], f"input {i} of {op.type} {op.name!r} under {sig} ({HAND})")
             for i, t in enumerate(op.inputs)]
    rejected = [(o.signature, o.cost) for o in ranked if o.signature != sig][:3]
    d.choices[op.name] = OpChoice(op.name, sig, mine.cost, reads, reason, rejected)
    for j, o in enumerate(op.outputs):
        d.placement[o] = op.placement
        d.produced[o] = d.sbp[o] = sig.outputs[j]
        if o in d.store_hints and d.store_hints[o][0] != sig.outputs[j]:
            w, hint = d.store_hints[o]
            b = d._new_boxing(tensor=o, kind="store", src_sbp=sig.outputs[j], dst_sbp=w,
                              src_placement=op.placement, dst_placement=op.placement,
                              plan=d.plan(o, sig.outputs[j], w, op.placement, op.placement), phase=op.phase,
                              stage=op.stage, reason=hint.describe())
            d.store_boxing[o] = b.id
            d.sbp[o] = w


def deduce_with_choices(graph: Graph, strategy: Strategy, chosen: Mapping[str, str],
                        cluster: Cluster | None = None) -> Deduction:
    """``deduce``, except that each op named in ``chosen`` takes the signature written there
    (``repr`` of an ``NdSignature``, e.g. ``"(S(0)), (B) -> (S(0))"``)."""
    unknown = sorted(set(chosen) - set(graph.op_by_name))
    if unknown:
        raise GraphError(f"signatures chosen for ops that are not in the graph: {', '.join(unknown)}")
    if not chosen:
        return deduce(graph, strategy, cluster)
    graph.validate()
    d = Deduction(graph, strategy, cluster)
    d.placement.update(assign_placements(graph, strategy))
    d.store_hints, d.use_hints = strategy.resolve_hints(graph)
    _check_hints(d)
    _source_sbps(d)
    successor_of = {new: old for old, new in graph.state_updates.items()}
    for op in graph.ops:
        if op.name in chosen:
            _choose_given(d, op, _pick(d, op, chosen[op.name]), successor_of)
        else:
            choose(d, op, successor_of)
    for old, new in graph.state_updates.items():
        if d.sbp[new] != d.sbp[old] or d.placement[new] != d.placement[old]:
            pl_new = d.placement[new]
            b = d._new_boxing(tensor=new, kind="write_back", src_sbp=d.sbp[new], dst_sbp=d.sbp[old],
                              src_placement=pl_new, dst_placement=d.placement[old],
                              plan=d.plan(new, d.sbp[new], d.sbp[old], pl_new, d.placement[old]), phase="update",
                              stage=graph.op_by_name[graph.tensors[new].producer].stage,
                              reason=f"{new} replaces {old}, which is stored {fmt_sbp(d.sbp[old])}")
            d.write_backs[old] = b.id
    return d
