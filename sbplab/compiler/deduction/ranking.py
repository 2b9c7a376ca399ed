"""How deduction ranks an op's signatures: the shared chooser, plus what only the compiler knows.

The rule itself is ``sbplab.ops.choose.rank_signatures``, the one eager uses (estimated boxing time
of the inputs from the SBP their producers left, then bytes, steps, per-rank FLOPs, listing order).
Deduction adds two things a lone eager op cannot know: an *extra* cost term, the boxing that brings
outputs to an SBP they must end in (a store hint, or the layout of the state an update replaces),
and pin hints, which rule out signatures that would box a pinned input. With neither, an op picks
exactly what eager picks. ``options`` lists every signature of an op with its price after a
deduction, first the one deduction takes, for people choosing by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...freeze import freeze_attrs
from ...ops.choose import FREE, BoxingCost, RankedSignature
from ...ops.choose import rank_signatures as choose_ranked
from ...ops.registry import NdSignature
from ...placement import Placement
from ...sbp import NdSbp, fmt_sbp
from ..ir import OpNode
from .caches import SCORES
from .signature_hints import signatures_of, valid_text
from .strategy import HintError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .deduce import Deduction

Scored = tuple[RankedSignature, ...]  # the signatures pins allow, best first


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


def output_term(d: Deduction, op: OpNode, want_out: dict) -> Callable[[NdSignature], BoxingCost] | None:
    """The compiler's extra term: boxing ``op``'s outputs to the SBP they must end in (None: no demand)."""
    if not want_out:
        return None

    def term(sig: NdSignature) -> BoxingCost:
        total = FREE
        for j, (w, pl, _) in want_out.items():
            total = total + d.cost(op.outputs[j], sig.outputs[j], w, op.placement, pl)
        return total
    return term


def _ranked(d: Deduction, op: OpNode, have: tuple, want_out: dict, allowed=None) -> list[RankedSignature]:
    metas = [d.graph.tensors[t].meta for t in op.inputs]
    return choose_ranked(op.type, metas, op.attrs, op.placement, have,
                         lambda i, w: d.cost(op.inputs[i], have[i], w, d.placement[op.inputs[i]], op.placement),
                         allowed=allowed, extra=output_term(d, op, want_out))


def pinned_inputs(d: Deduction, op: OpNode) -> tuple[tuple[int, NdSbp], ...]:
    """(input index, SBP) of the inputs a pin hint says must be read as stored."""
    return tuple((i, d.store_hints[t][0]) for i, t in enumerate(op.inputs)
                 if t in d.store_hints and d.store_hints[t][1].pin)


def rank_signatures(d: Deduction, op: OpNode, have: tuple, want_out: dict) -> Scored:
    """The signatures pins allow, best first, by the shared chooser's rule.

    Identical layers ask identical questions, and so do successive deductions of one model: the
    ranking is cached on everything it depends on.
    """
    g = d.graph
    pinned = pinned_inputs(d, op)
    key = (op.type, tuple(g.tensors[t].meta for t in op.inputs), freeze_attrs(op.attrs), op.placement, have,
           tuple(d.placement[t] for t in op.inputs), tuple((j, w, pl) for j, (w, pl, _) in want_out.items()),
           pinned, d.hardware)
    scored = SCORES.get(key)
    if scored is not None:
        return scored
    cands = signatures_of(g, op)  # also turns a registry error into one that names the op
    ranked = _ranked(d, op, have, want_out, (lambda s: all(s.inputs[i] == nd for i, nd in pinned)) if pinned else None)
    if not ranked:
        i, nd = pinned[0]
        raise HintError(
            f"tensor {op.inputs[i]!r} is pinned to {fmt_sbp(nd)} by {d.store_hints[op.inputs[i]][1].describe()}, "
            f"but op {op.name!r} ({op.type}) has no signature reading it that way with its other inputs; "
            f"valid signatures: {valid_text(cands, 8)}")
    return SCORES.put(key, tuple(ranked))


@dataclass(frozen=True)
class Option:
    """One signature an op may take, with the boxing it would cost given what its producers left."""

    signature: NdSignature
    cost: int  # bytes sent to box inputs (and outputs to the SBP they must end in)
    changes: int  # inputs that need any boxing (local slices count)
    blocked: str = ""  # the pin hint this signature contradicts, if any (deduction never takes it)
    time_s: float = 0.0  # estimated time of that boxing: the first ranking key
    steps: int = 0  # boxing steps
    flops: int = 0  # per-rank FLOPs of the op under this signature

    @property
    def text(self) -> str:
        return repr(self.signature)


def options(d: Deduction, op_name: str) -> list[Option]:
    """Every signature of ``op_name`` priced as deduction prices them, in deduction's order: the ones
    pins allow first, then by the chooser's rule, so the first is deduction's own pick."""
    if op_name not in d.choices:
        raise KeyError(f"op {op_name!r} has no deduced signature; pick one of the graph's ops")
    op = d.graph.op_by_name[op_name]
    have = tuple(d.read_state(t, op.phase, op.stage)[0] for t in op.inputs)
    pinned = pinned_inputs(d, op)
    out = []
    for c in _ranked(d, op, have, wanted_outputs(d, op)):
        bad = [(op.inputs[i], nd) for i, nd in pinned if c.signature.inputs[i] != nd]
        blocked = "; ".join(f"{d.store_hints[t][1].describe()} pins {t!r} to {fmt_sbp(nd)}" for t, nd in bad)
        out.append(Option(c.signature, c.boxing_bytes, c.inputs_changed, blocked, c.boxing_time_s,
                          c.boxing_steps, c.local_flops))
    return sorted(out, key=lambda o: bool(o.blocked))  # stable: the chooser's order within each group
