"""A candidate as an ordinary ``Strategy``: its mesh (or stages), a signature hint per forward op, and
store hints for what the search decided about sources: each parameter kept as its reader reads it
(ZeRO-3: sharded, with a use hint gathering it back), its gradient and optimizer state as the ZeRO
level shards them, each data input as its first reader reads it. ``sl.compile`` takes it unchanged,
and deduction derives the backward and update ops from it, as for any strategy."""

from __future__ import annotations

from ..compiler.deduction.signature_hints import escape
from ..compiler.deduction.strategy import Strategy
from ..sbp import fmt_sbp
from .backward_pins import backward_signatures
from .cost import Pricer
from .problem import OpProblem


def strategy_for(problem: OpProblem, assign: list[int], zero: int, name: str, n_stages: int = 1,
                 stage_prefixes: dict[str, int] | None = None) -> Strategy:
    g = problem.graph
    mesh = problem.mesh
    if n_stages > 1:
        stages = [type(mesh)(mesh.shape, mesh.links, s * mesh.size).placement() for s in range(n_stages)]
        st = Strategy(stages[0], stages=stages, stage_of=dict(stage_prefixes or {}),
                      micro_batches=problem.micro_batches, name=name)
    else:
        st = Strategy(mesh.placement(), micro_batches=problem.micro_batches, name=name)
    pricer = Pricer(g, mesh.placement(), problem.hw)
    states: dict[str, list[str]] = {}
    for op in g.ops_in("update"):
        ps = [i for i in op.inputs if g.tensors[i].role == "param"]
        if ps:
            states[ps[0]] = [i for i in op.inputs if g.tensors[i].role == "state"
                             and g.tensors[i].shape == g.tensors[ps[0]].shape]
    seen: set[str] = set()
    for o, i in zip(problem.ops, assign):
        sig = o.sigs[i]
        st.signature(escape(o.name), sig, why=f"searched ({o.op.type})")
        for pos, t in enumerate(o.op.inputs):
            tn = g.tensors[t]
            if tn.producer is not None or t in seen or tn.role not in ("param", "input"):
                continue
            seen.add(t)
            read = sig.inputs[pos]
            if tn.role == "input":
                st.hint(escape(t), read, f"searched: read {fmt_sbp(read)} by {o.name}", role="input")
                continue
            lay = pricer.param_layout(tn.meta, read, zero)
            why = f"searched: read {fmt_sbp(read)} by {o.name}" + (f", ZeRO-{zero}" if zero else "")
            if not lay.sharded or lay.stored != lay.kept:  # ZeRO-2 adds none, as its preset: the update then
                st.hint(escape(t), lay.stored, why, role="param")  # runs on the shards, writing the parameter back
            if lay.stored != lay.kept:
                st.hint(escape(t), lay.read, why + ": gathered for use", role="param", use=True)
            if not lay.sharded:  # gradient and state: deduction derives them from the parameter, as in the
                continue  # data-parallel preset (a store hint would make a backward op gather its inputs
                # to skip a reduction that the bucket makes nearly free)
            if t in g.grads:
                st.hint(escape(g.grads[t]), lay.grad, why, role="grad")
            for s in (t, *states.get(t, ())):  # the update runs on the shards: new parameter and states too
                for u in ((s,) if s != t else ()) + ((g.state_updates[s],) if s in g.state_updates else ()):
                    st.hint(escape(u), lay.state, why, role="state")
    for name, sig in backward_signatures(g, problem.signatures(assign)).items():
        st.signature(escape(name), sig, why="searched: mirrors its forward op")
    return st
