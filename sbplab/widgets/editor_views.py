"""The StrategyEditor's pieces that need no widget: the cached training graph, and the rows, tables
and graph text it shows for a ``Compiled`` step. Plain functions of their arguments, so each view
is exactly what the compiler's objects say."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..compiler.api import Compiled
from ..compiler.deduction.ranking import options
from ..compiler.ir import PHASES, Graph
from ..compiler.training.training_graph import trace_training_graph
from ..viz.dot import MAX_NODES, node_count
from ..viz.graph_dot import logical_dot
from ..viz.module_dot import logical_module_dot, physical_module_dot
from ..viz.physical_dot import physical_dot
from .strategy_form import module_unit
from .zoo import BuiltModel

MAX_OP_ROWS = 800


def training_graph(model: BuiltModel, micro_batches: int, optimizer: Any) -> Graph:
    """What ``compile`` builds before deducing (trace per micro-batch, autodiff, optimizer); it does
    not depend on the strategy, so SBP changes reuse it. One micro-batch reuses the model's graph."""
    return trace_training_graph(model.module, model.inputs, model.loss_fn, model.target, micro_batches, optimizer,
                                full_batch_graph=model.graph)


def memory_rows(c: Compiled) -> list[dict[str, int]]:
    return [{"rank": r, "params": m.params, "grads": m.grads, "optimizer_state": m.optimizer_state,
             "activations_peak": m.activations_peak, "in_flight": m.micro_batches_in_flight, "peak": m.peak}
            for r, m in sorted(c.memory.ranks.items())]


def module_stages(c: Compiled) -> list[dict[str, Any]]:
    """The pipeline stage each module unit got (the stage of its first forward op)."""
    out: dict[str, int] = {}
    for op in c.graph.ops:
        if op.phase == "forward" and op.module:
            out.setdefault(module_unit(op.module), op.stage)
    return [{"name": n, "stage": s} for n, s in out.items()]


def parse_ranks(text: str, ranks: list[int]) -> list[int]:
    """``"all"`` or ``"0, 2"`` -> ranks to draw, each one of ``ranks``."""
    t = text.strip().lower()
    if t in ("", "all"):
        return list(ranks)
    items = t.replace(",", " ").split()
    want = [int(x) for x in items if x.isdigit()]
    if not want or len(want) != len(items) or any(r not in ranks for r in want):
        raise ValueError(f"ranks to show {text!r}: write 'all' or ranks among {list(ranks)}")
    return want


def graph_dot(c: Compiled, kind: str, phases: list[str], ranks_text: str, collapse: bool
              ) -> tuple[str, Callable[[], str]]:
    """DOT text of the physical or the deduced logical graph, and how to get its text form."""
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise ValueError(f"graph phases {list(phases)}: pick some of {', '.join(PHASES)}")
    shown = tuple(p for p in PHASES if p in phases)
    if kind == "physical":
        ranks = parse_ranks(ranks_text, list(c.physical.ranks))
        dot = physical_dot(c.physical, c.graph, ranks=ranks, phases=shown, collapse=collapse,
                           title=f"{c.strategy.name}: physical graph, ranks {ranks}, {', '.join(shown)}")
        if node_count(dot) > MAX_NODES:  # too big to draw op by op: grouped by module and alike ranks
            dot = physical_module_dot(c.physical, c.graph, phases=shown)
        return dot, lambda: "\n".join(n.describe() for n in c.physical.nodes if n.rank in ranks and n.phase in shown)
    if kind == "logical":
        dot = logical_dot(c.graph, phases=shown, collapse=collapse, deduction=c.deduction,
                          title=f"{c.strategy.name}: deduced logical graph, {', '.join(shown)}")
        if node_count(dot) > MAX_NODES:
            dot = logical_module_dot(c.graph, phases=shown, deduction=c.deduction)
        return dot, lambda: c.dump(shown)
    raise ValueError(f"graph kind {kind!r}: pick physical or logical")


def op_rows(c: Compiled, phase: str, text: str, choices: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
    """The op table (ops of ``phase`` or "all" whose name, type or module contain ``text``) and a note."""
    if phase not in (*PHASES, "all"):
        raise ValueError(f"op phase {phase!r}: pick one of {', '.join(PHASES)}, all")
    f = text.strip().lower()
    rows = []
    for op in c.graph.ops:
        if phase != "all" and op.phase != phase:
            continue
        if f and f not in op.name.lower() and f not in op.type and f not in op.module.lower():
            continue
        ch = c.deduction.choices[op.name]
        rows.append({"name": op.name, "type": op.type, "module": op.module, "phase": op.phase, "stage": op.stage,
                     "signature": repr(ch.signature), "cost": ch.cost, "hand": op.name in choices,
                     "boxed": sum(r is not None for r in ch.reads)})
    note = f"showing {MAX_OP_ROWS} of {len(rows)} ops: filter to see the rest" if len(rows) > MAX_OP_ROWS else ""
    return rows[:MAX_OP_ROWS], note


def candidate_rows(c: Compiled, op: str, choices: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every valid signature of ``op``, cheapest first, marked chosen / deduction's best / by hand."""
    if op not in c.graph.op_by_name:
        raise ValueError(f"op {op!r} is not in the graph; pick one from the table")
    chosen = c.deduction.choices[op].signature
    return [{"signature": o.text, "cost": o.cost, "changes": o.changes, "chosen": o.signature == chosen,
             "best": k == 0, "hand": choices.get(op) == o.text, "blocked": o.blocked}
            for k, o in enumerate(options(c.deduction, op))]
