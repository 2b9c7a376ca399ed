"""SBP deduction over a whole training graph, OneFlow-style, with a reason for every choice.

Sources (params, inputs, states) take their hinted SBP, else ``B`` (a state takes its param's).
Then, op by op in topological order, each op picks one of its n-D signatures by the rule eager uses
too (``sbplab.ops.choose``): the least estimated time of boxing its inputs from the SBP their
producers left, then bytes sent, boxing steps, per-rank FLOPs. Deduction adds what it knows
downstream as an extra term of the same cost: the boxing that brings outputs to any SBP they must
end in (a hint, or the SBP of the state an update replaces). A signature that reads every input as
it is costs nothing, so an op keeps its producers' SBP when any signature accepts it, exactly as
OneFlow does. An op named by a signature hint takes that signature instead, priced and boxed the
same way.

Plans, costs and each op's ranking are pure functions of their keys and live in ``memo``'s
bounded caches, shared by all deductions: re-deducing after a small strategy change re-plans only
what changed.

Gradients need no special case: a batch-split ``x`` times a broadcast ``w`` makes a ``P``
weight gradient by the signature of the backward's ``mm``; the optimizer's signatures then pull
it to ``B`` (all-reduce) or, when the state is stored ``S(0)``, to ``S(0)`` (reduce-scatter).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from ...boxing import BoxingPlan, plan_boxing
from ...boxing.planner import boxing_cost
from ...boxing.route import BoxingError
from ...fmt import fmt_time
from ...gc_pause import without_gc
from ...hardware import Hardware
from ...layout import LayoutError, check_layout
from ...ops.choose import BoxingCost, RankedSignature
from ...ops.registry import NdSignature, TensorMeta
from ...placement import Placement
from ...sbp import B, Broadcast, NdSbp, Partial, Split, fmt_sbp, is_chunked
from ..ir import Graph, OpNode
from .caches import COSTS, PLANS
from .decisions import Boxing, OpChoice
from .layers import layer_twins
from .ranking import Scored, options, pinned_inputs, rank_signatures, wanted_outputs
from .signature_hints import SignatureError, SignatureHint, forced_signatures
from .staging import assign_placements
from .strategy import Hint, HintError, Strategy


class Deduction:
    """The result: placement and SBP of every tensor, a signature per op, and every boxing."""

    def __init__(self, graph: Graph, strategy: Strategy, hardware: Hardware | None = None) -> None:
        self.graph, self.strategy, self.hardware = graph, strategy, hardware
        self.placement: dict[str, Placement] = {}
        self.sbp: dict[str, NdSbp] = {}  # as stored (after a store boxing, if any)
        self.produced: dict[str, NdSbp] = {}  # as the producer's signature made it
        self.choices: dict[str, OpChoice] = {}
        self.boxings: list[Boxing] = []
        self.store_boxing: dict[str, int] = {}
        self.write_backs: dict[str, int] = {}
        self.store_hints: dict[str, tuple[NdSbp, Hint]] = {}
        self.use_hints: dict[str, tuple[NdSbp, Hint]] = {}
        self.forced: dict[str, tuple[NdSignature, SignatureHint]] = {}  # op -> signature a hint gives it
        self.successor_of = {new: old for old, new in graph.state_updates.items()}
        self._shared: dict[tuple, int] = {}
        self.twins: dict[str, str] = {}  # op -> its twin one layer earlier (layers.py)
        self._asked: dict[str, tuple[tuple, Scored] | None] = {}  # twins: question and ranking, as asked
        self.copied = 0  # ops that took their twin's ranking instead of ranking their signatures again

    # --- boxing plans, cached across deductions ----------------------------------------------------
    def plan(self, tensor: str, src: NdSbp, dst: NdSbp, src_pl: Placement, dst_pl: Placement) -> BoxingPlan:
        m = self.graph.tensors[tensor].meta
        key = (m.shape, m.dtype, src, dst, src_pl, dst_pl, self.hardware)
        p = PLANS.get(key)
        if p is None:
            p = PLANS.put(key, plan_boxing(m.shape, src, dst, src_pl, dst_pl if dst_pl != src_pl else None,
                                           dtype=m.dtype, hardware=self.hardware))
        return p

    def cost(self, tensor: str, src: NdSbp, dst: NdSbp, src_pl: Placement, dst_pl: Placement) -> BoxingCost:
        """Time, bytes and steps of a layout change; same-placement costs depend only on the mesh shape."""
        if src_pl == dst_pl:
            if src == dst:
                return BoxingCost()
            m = self.graph.tensors[tensor].meta
            key = (m.shape, m.dtype, src, dst, src_pl.shape, src_pl.device_type, self.hardware)
            c = COSTS.get(key)
            if c is None:
                try:
                    c = COSTS.put(key, route_cost(m, src, dst, src_pl, self.hardware))
                except (BoxingError, LayoutError):  # a strided split no route reaches (its dim split twice):
                    # a signature never chosen; to and from B and P boxing moves it at its real price
                    if not any(is_chunked(x) for x in (*src, *dst)):
                        raise
                    c = COSTS.put(key, BoxingCost(1e9, 0, 1))  # a billion seconds: never the cheapest
            return c
        return BoxingCost.of(self.plan(tensor, src, dst, src_pl, dst_pl))

    def _new_boxing(self, **kw) -> Boxing:
        b = Boxing(id=len(self.boxings), **kw)
        self.boxings.append(b)
        return b

    # --- reading a tensor ------------------------------------------------------------------------
    def read_state(self, tensor: str, phase: str, stage: int) -> tuple[NdSbp, int | None]:
        """How consumers find ``tensor``: its use SBP (through a shared use boxing) or as stored.

        Updates read the stored layout: a ZeRO parameter is gathered for compute, not for its update.
        """
        if tensor not in self.use_hints or phase == "update":
            return self.sbp[tensor], None
        use, hint = self.use_hints[tensor]
        if use == self.sbp[tensor]:
            return use, None
        key = ("use", tensor, phase)
        if key not in self._shared:
            pl = self.placement[tensor]
            b = self._new_boxing(tensor=tensor, kind="use", src_sbp=self.sbp[tensor], dst_sbp=use,
                                 src_placement=pl, dst_placement=pl,
                                 plan=self.plan(tensor, self.sbp[tensor], use, pl, pl), phase=phase, stage=stage,
                                 reason=hint.describe())
            self._shared[key] = b.id
        return use, self._shared[key]

    def read(self, op: OpNode, tensor: str, want: NdSbp, why: str | Callable[[], str]) -> int | None:
        """The boxing (shared per tensor, target and phase) that gives ``op`` the tensor as ``want``;
        ``why`` may be a function, called only when a boxing is made (most reads need none)."""
        have, via = self.read_state(tensor, op.phase, op.stage)
        src_pl = self.placement[tensor]
        if have == want and src_pl == op.placement:
            if via is not None:
                self.boxings[via].consumers.append(op.name)
            return via
        key = ("in", tensor, want, op.placement, op.phase)
        if src_pl != op.placement and op.phase == "backward" and key[:-1] + ("forward",) in self._shared:
            key = key[:-1] + ("forward",)  # a pipeline stage keeps what it received for backward, not re-sent
        # reducing a gradient for its update is the end of the backward pass (as in DDP)
        phase = "backward" if op.phase == "update" and self.graph.tensors[tensor].role == "grad" else op.phase
        if key not in self._shared:
            b = self._new_boxing(tensor=tensor, kind="input", src_sbp=have, dst_sbp=want, src_placement=src_pl,
                                 dst_placement=op.placement, plan=self.plan(tensor, have, want, src_pl, op.placement),
                                 phase=phase, stage=op.stage, reason=why if isinstance(why, str) else why(),
                                 source=via)
            self._shared[key] = b.id
        b = self.boxings[self._shared[key]]
        b.consumers.append(op.name)
        return b.id

    # --- queries ---------------------------------------------------------------------------------
    def explain(self, op_name: str) -> str:
        """Why ``op_name`` got its signature: inputs as found, the choice, the runners-up."""
        if op_name not in self.graph.op_by_name:
            close = difflib.get_close_matches(op_name, list(self.graph.op_by_name), n=5, cutoff=0.4)
            raise KeyError(f"no op named {op_name!r} in this graph; close names: {close or 'none'} "
                           f"(graph.ops lists all {len(self.graph.ops)})")
        op = self.graph.op_by_name[op_name]
        c = self.choices[op_name]
        lines = [f"{op.name} = {op.type}({', '.join(op.inputs)}) on {op.placement}, stage {op.stage}, {op.phase}"]
        for i, t in enumerate(op.inputs):
            have = self.read_state(t, op.phase, op.stage)[0]
            via = c.reads[i]
            how = f"boxed {self.boxings[via].describe()}" if via is not None else "read as is"
            lines.append(f"  input {t}: {fmt_sbp(have)}, needs {fmt_sbp(c.signature.inputs[i])}: {how}")
        lines.append(f"  chosen {c.signature} ({c.cost} B of boxing): {c.reason}")
        times = {o.signature: o.time_s for o in options(self, op_name)}
        for sig, cost in c.rejected:
            lines.append(f"  rejected {sig}: {cost} B, est. {fmt_time(times[sig])}")
        for o in op.outputs:
            if o in self.store_boxing:
                lines.append(f"  output {self.boxings[self.store_boxing[o]].describe()}")
        return "\n".join(lines)

    def collective_boxings(self, phase: str | None = None) -> list[Boxing]:
        """Boxings that talk (any step other than a local slice or zero fill)."""
        return [b for b in self.boxings if (phase is None or b.phase == phase)
                and b.plan.communicates]

    def total_bytes(self) -> int:
        return sum(b.bytes for b in self.boxings)


def route_cost(m: TensorMeta, src: NdSbp, dst: NdSbp, pl: Placement, hardware: Hardware | None = None) -> BoxingCost:
    """``BoxingCost.of(plan_boxing(...))`` without making the plan (``boxing.planner.boxing_cost``)."""
    return BoxingCost(*boxing_cost(m.shape, src, dst, pl, m.dtype, hardware))


def is_local_change(src: NdSbp, dst: NdSbp) -> bool:
    """True when going from ``src`` to ``dst`` is a local slice or zero fill on every rank (0 bytes).

    Each changed axis must go B -> anything or S(d) -> P; a B -> S(d) or S(d) -> P on axis a is only
    local if no later axis splits dim d too (nested splits would move the blocks). Conservative:
    False sends the question to the planner.
    """
    for a, (x, y) in enumerate(zip(src, dst)):
        if x == y:
            continue
        if isinstance(x, Broadcast) and isinstance(y, Partial):
            continue
        d = y.dim if isinstance(x, Broadcast) and isinstance(y, Split) else \
            x.dim if isinstance(x, Split) and isinstance(y, Partial) else None
        if d is None:
            return False
        later = list(src[a + 1:]) + list(dst[a + 1:])
        if any(isinstance(z, Split) and z.dim == d for z in later):
            return False
    return True


def _source_sbps(d: Deduction) -> None:
    g, nd = d.graph, d.strategy.mesh_ndim
    all_b = tuple(B for _ in range(nd))
    for name in g.sources():
        t = g.tensors[name]
        if name in d.store_hints:
            d.sbp[name] = d.store_hints[name][0]
        elif t.role == "state":
            owner = next((op.inputs[0] for op in g.consumers(name) if op.phase == "update"), name)
            d.sbp[name] = d.sbp.get(owner, all_b) if owner != name else all_b
        else:
            d.sbp[name] = all_b
        d.produced[name] = d.sbp[name]


def _check_hints(d: Deduction) -> None:
    for table in (d.store_hints, d.use_hints):
        for name, (nd, hint) in table.items():
            try:
                check_layout(d.graph.tensors[name].shape, d.placement[name], nd, f"tensor {name!r}")
            except LayoutError as e:
                raise HintError(f"{e} (demanded by {hint.describe()})") from None


def _forced_choice(d: Deduction, op: OpNode, scored: Scored) -> tuple[RankedSignature, str, list]:
    sig, hint = d.forced[op.name]
    mine = next((c for c in scored if c.signature == sig), None)
    if mine is None:  # the op has it (checked when the hints were resolved), so a pin rules it out
        i, t = next((i, t) for i, t in enumerate(op.inputs) if t in d.store_hints and d.store_hints[t][1].pin
                    and d.store_hints[t][0] != sig.inputs[i])
        raise SignatureError(op.name, f"op {op.name!r} ({op.type}): the signature {sig} forced by {hint.describe()} "
                                      f"contradicts a hint: {d.store_hints[t][1].describe()} pins {t!r} to "
                                      f"{fmt_sbp(d.store_hints[t][0])}; force a signature reading input {i} "
                                      f"that way, or drop one of the two")
    best = scored[0]
    reason = f"forced by {hint.describe()}" + ("" if best.signature == sig else
                                               f"; deduction would take {best.signature} ({best.boxing_bytes} B)")
    return mine, reason, [(c.signature, c.boxing_bytes) for c in scored if c.signature != sig][:3]


def _reason(best: RankedSignature, used: list[str]) -> str:
    """Why the chooser's pick won, in words."""
    if best.keeps_inputs and best.boxing_bytes == 0:
        return ("keeps every input's SBP: no boxing" if not used else
                f"keeps every input's SBP as read: no further boxing ({', '.join(used)} "
                f"arrive through use boxings, above)")
    if best.boxing_bytes == 0:
        return f"only local boxing ({best.inputs_changed} input(s) sliced or zero-filled, no bytes sent)"
    return (f"least estimated boxing time ({fmt_time(best.boxing_time_s)}, {best.boxing_bytes} B, "
            f"{best.boxing_steps} step(s))")


def _ranking(d: Deduction, op: OpNode, have: tuple, want_out: dict) -> Scored:
    """``rank_signatures``, or the ranking ``op``'s twin one layer earlier got for the same question
    (``layers.py``: the rest of the question was found equal when the twins were paired)."""
    twin = d.twins.get(op.name)
    if twin is None and op.name not in d._asked:
        return rank_signatures(d, op, have, want_out)
    question = (have, tuple([(j, w, pl) for j, (w, pl, _) in want_out.items()]) if want_out else (),
                pinned_inputs(d, op) if d.store_hints else ())
    asked = d._asked.get(twin) if twin is not None else None
    if asked is not None and asked[0] == question:
        scored = asked[1]
        d.copied += 1
    else:
        scored = rank_signatures(d, op, have, want_out)
    d._asked[op.name] = (question, scored)
    return scored


def choose(d: Deduction, op: OpNode) -> None:
    """Give ``op`` its signature (the forced one, else the chooser's pick), box its inputs, record why."""
    inputs = op.inputs
    # an input with a use hint is read through its use boxing (ZeRO's gathered params); most have none
    hinted = bool(d.use_hints) and op.phase != "update" and any(t in d.use_hints for t in inputs)
    if hinted:
        states = [d.read_state(t, op.phase, op.stage) for t in inputs]
        have = tuple([sbp for sbp, _ in states])
        used = [t for t, (_, via) in zip(inputs, states) if via is not None]
    else:
        sbp_of = d.sbp
        have = tuple([sbp_of[t] for t in inputs])
        used = []
    want_out = wanted_outputs(d, op)
    scored = _ranking(d, op, have, want_out)
    if op.name in d.forced:
        pick, reason, rejected = _forced_choice(d, op, scored)
    else:
        pick, reason = scored[0], _reason(scored[0], used)
        rejected = [(c.signature, c.boxing_bytes) for c in scored[1:4]]
    sig, cost = pick.signature, pick.boxing_bytes
    if want_out:
        reason += "; outputs must end as " + ", ".join(
            f"{op.outputs[j]} {fmt_sbp(w)} ({why})" for j, (w, _, why) in want_out.items())
    reads: list[int | None] = []
    where, pl = d.placement, op.placement
    for i, t in enumerate(inputs):
        want = sig.inputs[i]
        if not hinted and have[i] == want and where[t] == pl:  # read as it is (what ``read`` finds first)
            reads.append(None)
        else:
            reads.append(d.read(op, t, want, lambda i=i: f"input {i} of {op.type} {op.name!r} under {sig}"))
    d.choices[op.name] = OpChoice(op.name, sig, cost, reads, reason, rejected)
    for j, o in enumerate(op.outputs):
        d.placement[o] = op.placement
        d.produced[o] = sig.outputs[j]
        d.sbp[o] = sig.outputs[j]
        if o in d.store_hints and d.store_hints[o][0] != sig.outputs[j]:
            w, hint = d.store_hints[o]
            b = d._new_boxing(tensor=o, kind="store", src_sbp=sig.outputs[j], dst_sbp=w,
                              src_placement=op.placement, dst_placement=op.placement,
                              plan=d.plan(o, sig.outputs[j], w, op.placement, op.placement), phase=op.phase,
                              stage=op.stage, reason=hint.describe())
            d.store_boxing[o] = b.id
            d.sbp[o] = w


@without_gc
def deduce(graph: Graph, strategy: Strategy, hardware: Hardware | None = None, *,
           forward_only: bool = False) -> Deduction:
    """Place every op and give every tensor an SBP; see the module docstring for the rules.

    ``forward_only``: choose only the forward ops' signatures and stop. Ops are chosen greedily in
    graph order, each from what its producers left and what its outputs must end as, so no later
    (backward or update) op changes a forward choice: a caller that needs only those (the search,
    pricing a preset) gets the same choices for a third of the work. The result is not compilable.
    """
    graph.validate()
    d = Deduction(graph, strategy, hardware)
    d.placement.update(assign_placements(graph, strategy, hardware))
    d.store_hints, d.use_hints = strategy.resolve_hints(graph)
    d.forced = forced_signatures(graph, strategy.signatures)
    _check_hints(d)
    _source_sbps(d)
    d.twins = layer_twins(graph, d.placement)
    d._asked = dict.fromkeys(d.twins.values())  # the twins' questions are kept as they are asked
    for op in graph.ops:
        if not forward_only or op.phase == "forward":
            choose(d, op)
    d._asked = {}
    if forward_only:
        return d
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
