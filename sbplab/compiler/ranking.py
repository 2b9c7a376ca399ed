"""How deduction prices and ranks an op's signatures, and the same prices for every signature of an op.

An op's price for a signature is the bytes of boxing it needs: its inputs from the SBP their
producers left to the SBP the signature reads, and its outputs to any SBP they must end in (a store
hint, or the layout of the state an update replaces). ``options`` lists every signature of an op
with its price after a deduction, first the one deduction takes, for people choosing by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ops.registry import NdSignature
from ..placement import Placement
from ..sbp import NdSbp, fmt_sbp
from .ir import OpNode
from .memo import SCORES, freeze
from .signature_hints import signatures_of, valid_text
from .strategy import HintError

if TYPE_CHECKING:
    from .deduce import Deduction

Scored = tuple[tuple[int, int, int, NdSignature], ...]  # (bytes, inputs changed, index, signature), best first


def wanted_outputs(d: Deduction, op: OpNode) -> dict[int, tuple[NdSbp, Placement, str]]:
    """Outputs that must end in a given SBP: a store hint, or the state an update replaces."""
    want: dict[int, tuple[NdSbp, Placement, str]] = {}
    for j, o in enumerate(op.outputs):
        if o in d.store_hints:
            want[j] = (d.store_hints[o][0], op.placement, d.store_hints[o][1].describe())
        elif o in d.successor_of:
            old = d.successor_of[o]
            want[j] = (d.sbp[old], d.placement[old], f"it replaces {old} after the step")
    return want


def price(d: Deduction, op: OpNode, sig: NdSignature, have: tuple, want_out: dict) -> tuple[int, int]:
    """(bytes of boxing, inputs that need any boxing) for ``op`` to take ``sig``."""
    cost = changes = 0
    for t, h, w in zip(op.inputs, have, sig.inputs):
        if h != w or d.placement[t] != op.placement:
            changes += 1
            cost += d.cost(t, h, w, d.placement[t], op.placement)
    for j, (w, pl, _) in want_out.items():
        cost += d.cost(op.outputs[j], sig.outputs[j], w, op.placement, pl)
    return cost, changes


def pinned_inputs(d: Deduction, op: OpNode) -> tuple[tuple[int, NdSbp], ...]:
    """(input index, SBP) of the inputs a pin hint says must be read as stored."""
    return tuple((i, d.store_hints[t][0]) for i, t in enumerate(op.inputs)
                 if t in d.store_hints and d.store_hints[t][1].pin)


def rank_signatures(d: Deduction, op: OpNode, have: tuple, want_out: dict) -> Scored:
    """The signatures pins allow, cheapest first (ties: fewer changed inputs, then listing order).

    Identical layers ask identical questions, and so do successive deductions of one model: the
    ranking is cached on everything it depends on.
    """
    g = d.graph
    pinned = pinned_inputs(d, op)
    key = (op.type, tuple(g.tensors[t].meta for t in op.inputs), freeze(op.attrs), op.placement, have,
           tuple(d.placement[t] for t in op.inputs), tuple((j, w, pl) for j, (w, pl, _) in want_out.items()),
           pinned, d.cluster)
    scored = SCORES.get(key)
    if scored is not None:
        return scored
    cands = signatures_of(g, op)
    allowed = [s for s in cands if all(s.inputs[i] == nd for i, nd in pinned)]
    if not allowed:
        i, nd = pinned[0]
        raise HintError(
            f"tensor {op.inputs[i]!r} is pinned to {fmt_sbp(nd)} by {d.store_hints[op.inputs[i]][1].describe()}, "
            f"but op {op.name!r} ({op.type}) has no signature reading it that way with its other inputs; "
            f"valid signatures: {valid_text(cands, 8)}")
    ranked = sorted(((*price(d, op, sig, have, want_out), k, sig) for k, sig in enumerate(allowed)),
                    key=lambda x: x[:3])
    return SCORES.put(key, tuple(ranked))



@dataclass(frozen=True)
class Option:
    """One signature an op may take, with the boxing it would cost given what its producers left."""

    signature: NdSignature
    cost: int  # bytes sent to box inputs (and outputs to the SBP they must end in)
    changes: int  # inputs that need any boxing (local slices count)
    blocked: str = ""  # the pin hint this signature contradicts, if any (deduction never takes it)

    @property
    def text(self) -> str:
        return repr(self.signature)


def options(d: Deduction, op_name: str) -> list[Option]:
    """Every signature of ``op_name`` priced as deduction prices them, in deduction's order: the ones
    pins allow first, then cheapest (ties: fewer changes), so the first is deduction's own pick."""
    if op_name not in d.choices:
        raise KeyError(f"op {op_name!r} has no deduced signature; pick one of the graph's ops")
    op = d.graph.op_by_name[op_name]
    have = tuple(d.read_state(t, op.phase, op.stage)[0] for t in op.inputs)
    want = wanted_outputs(d, op)
    pinned = pinned_inputs(d, op)
    out = []
    for sig in signatures_of(d.graph, op):
        bad = [(op.inputs[i], nd) for i, nd in pinned if sig.inputs[i] != nd]
        blocked = "; ".join(f"{d.store_hints[t][1].describe()} pins {t!r} to {fmt_sbp(nd)}" for t, nd in bad)
        out.append(Option(sig, *price(d, op, sig, have, want), blocked))
    order = sorted(range(len(out)), key=lambda k: (bool(out[k].blocked), out[k].cost, out[k].changes, k))
    return [out[k] for k in order]
