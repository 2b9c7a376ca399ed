"""Placing ops: every op gets a placement and a pipeline stage; sources live where they are used.

Forward ops are cut into contiguous runs of the topological order, one run per stage: explicit
``stage_of`` prefixes first, otherwise balanced by FLOPs. A contiguous cut of a topological order
never sends data backwards, so stage s only ever feeds stages > s. Backward ops run on the stage
of the forward op they differentiate, updates on the stage of their parameter.
"""

from __future__ import annotations

from ...ops.registry import get_op
from ...placement import Placement
from ..ir import Graph, OpNode
from .strategy import Strategy


def _flops(graph: Graph, op: OpNode) -> int:
    d = get_op(op.type)
    ins = [graph.tensors[i].meta for i in op.inputs]
    outs = [graph.tensors[o].meta for o in op.outputs]
    try:
        return int(d.flops(ins, outs, op.attrs)) + 1
    except Exception:  # a FLOP formula that cannot handle these shapes still gets a weight
        return 1


def _explicit_stage(strategy: Strategy, module: str) -> int | None:
    best, stage = -1, None
    for prefix, s in strategy.stage_of.items():
        if (module == prefix or module.startswith(prefix + ".") or prefix == "") and len(prefix) > best:
            best, stage = len(prefix), s
    return stage


def forward_stages(graph: Graph, strategy: Strategy) -> dict[str, int]:
    """Stage of each forward op."""
    fwd = [op for op in graph.ops if op.phase == "forward"]
    n = strategy.n_stages
    out: dict[str, int] = {}
    if n == 1:
        return {op.name: 0 for op in fwd}
    if strategy.stage_of:
        for op in fwd:
            s = _explicit_stage(strategy, op.module)
            prev = max((out[p.name] for i in op.inputs if (p := graph.producer(i)) is not None
                        and p.name in out), default=0)
            out[op.name] = max(prev, s if s is not None else prev)
        return out
    weights = [_flops(graph, op) for op in fwd]
    total = sum(weights)
    acc = 0
    for op, w in zip(fwd, weights):
        # the op belongs to the stage its FLOP midpoint falls in
        out[op.name] = min(n - 1, int((acc + w / 2) * n / total))
        acc += w
    return out


def assign_placements(graph: Graph, strategy: Strategy) -> dict[str, Placement]:
    """Set ``op.placement`` and ``op.stage`` on every op; returns the placement of every tensor."""
    stages = strategy.stages or [strategy.placement]
    fstage = forward_stages(graph, strategy)
    param_stage: dict[str, int] = {}
    for op in graph.ops:
        if op.phase == "forward":
            op.stage = fstage[op.name]
            for i in op.inputs:
                if graph.tensors[i].producer is None:
                    param_stage.setdefault(i, op.stage)
    last = max(fstage.values(), default=0)
    pending_fills: list[OpNode] = []
    for op in graph.ops:
        if op.phase == "forward":
            continue
        if op.forward_op is not None:
            op.stage = graph.op_by_name[op.forward_op].stage
        elif op.phase == "update":
            owners = [param_stage[i] for i in op.inputs if i in param_stage]
            op.stage = owners[0] if owners else 0
        elif op.inputs:
            op.stage = max(_stage_of_tensor(graph, i, param_stage) for i in op.inputs)
        else:
            pending_fills.append(op)
    for op in pending_fills:  # constants made in backward: the loss seed, zero gradients
        users = [graph.op_by_name[c].stage for o in op.outputs for c in graph.tensors[o].consumers
                 if graph.op_by_name[c] not in pending_fills]
        op.stage = min(users) if users else last
    for op in graph.ops:
        op.placement = stages[op.stage]
    where: dict[str, Placement] = {}
    for name, t in graph.tensors.items():
        if t.producer is not None:
            where[name] = graph.op_by_name[t.producer].placement
        elif name in param_stage:
            where[name] = stages[param_stage[name]]
        else:  # states (and unused sources): with their param's update op, else the first consumer
            users = [graph.op_by_name[c] for c in t.consumers]
            where[name] = users[0].placement if users else stages[0]
    return where


def _stage_of_tensor(graph: Graph, name: str, param_stage: dict[str, int]) -> int:
    t = graph.tensors[name]
    if t.producer is not None:
        return graph.op_by_name[t.producer].stage
    return param_stage.get(name, 0)
