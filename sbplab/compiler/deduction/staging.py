"""Placing ops: every op gets a placement and a pipeline stage; sources live where they are used.

Forward ops are cut into contiguous runs of the topological order, one run per stage: explicit
``stage_of`` prefixes first, otherwise balanced by FLOPs. A contiguous cut of a topological order
never sends data backwards, so stage s only ever feeds stages > s. Backward ops run on the stage
of the forward op they differentiate (a sum of gradient contributions: the earliest stage its parts are on), updates
on the stage of their parameter.

Where a cut falls matters beyond balance: every activation crossing it is a message per micro-batch
forward and its gradient one back. Cutting a residual block in the middle sends two tensors (the
branch and the skip) where a cut at the block's edge sends one. So each cut goes where the stage
imbalance it adds plus the messages it needs cost least, both as time on the hardware deduction
prices boxing on (``Hardware.cpu_box()`` by default).
"""

from __future__ import annotations

from ...errors import InputError
from ...hardware import Hardware
from ...layout import numel
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


def forward_stages(graph: Graph, strategy: Strategy, hardware: Hardware | None = None) -> dict[str, int]:
    """Stage of each forward op."""
    fwd = [op for op in graph.ops if op.phase == "forward"]
    n = strategy.n_stages
    out: dict[str, int] = {}
    if n == 1:
        return {op.name: 0 for op in fwd}
    _check_stages(fwd, strategy)
    if strategy.stage_of:
        for op in fwd:
            s = _explicit_stage(strategy, op.module)
            prev = max((out[p.name] for i in op.inputs if (p := graph.producer(i)) is not None
                        and p.name in out), default=0)
            out[op.name] = max(prev, s if s is not None else prev)
        return out
    cuts = _cuts(graph, fwd, n, hardware or Hardware.cpu_box())
    for s, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(fwd)])):
        out.update((op.name, s) for op in fwd[a:b])
    return out


def _check_stages(fwd: list[OpNode], strategy: Strategy) -> None:
    """Refuse, before any cut is searched, more stages than forward ops and ``stage_of`` prefixes that
    name no module of the model (a typo would otherwise silently leave the balanced cut in place)."""
    n = strategy.n_stages
    modules = list(dict.fromkeys(op.module for op in fwd if op.module))
    if n > len(fwd):
        raise InputError(f"a pipeline of {n} stages needs at least one forward op per stage, but this model's "
                         f"forward has {len(fwd)} ops (modules: {', '.join(modules[:12]) or 'none'}); use at most "
                         f"{len(fwd)} stages")
    for prefix in strategy.stage_of:
        if prefix and not any(m == prefix or m.startswith(prefix + ".") for m in modules):
            tops = list(dict.fromkeys(m.split(".")[0] for m in modules))
            raise InputError(f"stage_of names {prefix!r}, which is no module of this model; module prefixes are "
                             f"{', '.join(tops[:20])} (and their children, e.g. {modules[0] if modules else '-'!r})")


def _cuts(graph: Graph, fwd: list[OpNode], n: int, hw: Hardware) -> list[int]:
    """Where stages 1..n-1 start in ``fwd``: for each, the position near its FLOP share whose added
    imbalance plus crossing messages (forward and back) take least time on ``hw``."""
    m = len(fwd)
    cum = [0]
    for op in fwd:
        cum.append(cum[-1] + _flops(graph, op))
    at = {op.name: i for i, op in enumerate(fwd)}
    count, nbytes = [0] * (m + 2), [0] * (m + 2)  # differences: a tensor made at p, last used at q crosses p+1..q
    for p, op in enumerate(fwd):
        for o in op.outputs:
            t = graph.tensors[o]
            q = max((at[c] for c in t.consumers if c in at), default=p)
            if q > p:
                size = numel(t.shape) * t.meta.dtype.itemsize
                count[p + 1] += 1
                count[q + 1] -= 1
                nbytes[p + 1] += size
                nbytes[q + 1] -= size
    for i in range(1, m + 1):
        count[i] += count[i - 1]
        nbytes[i] += nbytes[i - 1]
    cuts, lo = [], 1
    for k in range(1, n):
        ideal = cum[m] * k / n
        hi = m - (n - k)  # leave an op for every later stage
        cuts.append(min(range(lo, hi + 1), key=lambda i: (
            abs(cum[i] - ideal) / hw.flops + 2 * hw.p2p_time(count[i], nbytes[i]), abs(cum[i] - ideal))))
        lo = cuts[-1] + 1
    return cuts


def assign_placements(graph: Graph, strategy: Strategy, hardware: Hardware | None = None) -> dict[str, Placement]:
    """Set ``op.placement`` and ``op.stage`` on every op; returns the placement of every tensor."""
    stages = strategy.stages or [strategy.placement]
    fstage = forward_stages(graph, strategy, hardware)
    param_stage: dict[str, int] = {}
    for op in graph.ops:
        if op.phase == "forward":
            op.stage = fstage[op.name]
            for i in op.inputs:
                if graph.tensors[i].producer is None:
                    param_stage.setdefault(i, op.stage)
    last = max(fstage.values(), default=0)
    # with weights split inside a stage, gradient parts are partial sums that cross 1:1 and are reduced
    # where they are summed; summing them on the later stage would make the crossing all-to-all
    tensor_parallel = strategy.splits_weights
    pending_fills: list[OpNode] = []
    for op in graph.ops:
        if op.phase == "forward":
            continue
        parts = set() if tensor_parallel else _gradient_parts_stages(graph, op)
        if parts:  # on the earliest stage its parts are on: one sum goes back instead of each part
            op.stage = min(parts)
        elif op.forward_op is not None:
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


def _gradient_parts_stages(graph: Graph, op: OpNode) -> set[int]:
    """For a backward ``add`` summing the gradient contributions of a tensor several ops read (its inputs
    come from the backward ops of those readers, not of the op it is filed under): the stages of its
    parts. Empty for any other op."""
    if op.type != "add" or op.phase != "backward" or op.forward_op is None:
        return set()
    producers = [graph.op_by_name[p] for i in op.inputs if (p := graph.tensors[i].producer) is not None]
    if len(producers) != len(op.inputs) or any(p.phase != "backward" or p.forward_op == op.forward_op
                                               for p in producers):
        return set()
    return {p.stage for p in producers}


def _stage_of_tensor(graph: Graph, name: str, param_stage: dict[str, int]) -> int:
    t = graph.tensors[name]
    if t.producer is not None:
        return graph.op_by_name[t.producer].stage
    return param_stage.get(name, 0)
