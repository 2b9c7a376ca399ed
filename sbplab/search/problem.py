"""The search space on one mesh, op by op: each forward op's signatures with their prices, and the
edges between forward ops with a price per pair of signatures.

The searched variables are the forward ops' n-D signatures. Backward and update ops are not searched:
deduction gives them the layouts the forward choices imply (gradients mirror activations), and the cost
model prices those implied layouts (``cost.py``). Sources (parameters, data inputs) belong to their
first forward reader: it decides how they are stored; a second reader pays an edge from that layout.

Arrays are numpy: ``compute[i]`` (seconds per micro-batch, forward and backward), ``gather[z][i]``
(seconds per micro-batch, ZeRO-3 gathers), ``sync[z][i]`` (seconds per step: gradient sync, update)
and ``memory[z][i]`` (bytes per device) for signature ``i`` at ZeRO level ``z``; an edge's ``cost[i, j]``
in seconds per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..compiler.deduction.signature_hints import signatures_of
from ..compiler.deduction.staging import assign_placements
from ..compiler.deduction.strategy import Strategy
from ..compiler.ir import Graph, OpNode
from ..hardware import Hardware
from ..ops.registry import NdSignature
from .cost import ZERO_LEVELS, Pricer, dual
from .mesh import MeshChoice


@dataclass
class OpSpace:
    """One forward op's choices and what each costs."""

    index: int
    op: OpNode
    sigs: list[NdSignature]
    compute: np.ndarray
    gather: dict[int, np.ndarray]
    sync: dict[int, np.ndarray]
    memory: dict[int, np.ndarray]
    activation: np.ndarray  # bytes of outputs one micro-batch keeps for backward (included in memory)
    unit: str = ""  # the layer it belongs to ("blocks.3"), where pipelines may cut

    @property
    def name(self) -> str:
        return self.op.name


@dataclass
class Edge:
    """Forward op ``src`` feeds ``dst`` (or, for a shared source, owns what ``dst`` also reads)."""

    src: int
    dst: int
    tensor: str
    cost: np.ndarray  # [len(src sigs), len(dst sigs)] seconds per micro-batch
    cross_stage: np.ndarray | None = None  # [len(src sigs)] seconds of a stage-to-stage move instead


@dataclass
class OpProblem:
    """Every forward op of a training graph on one mesh, priced."""

    graph: Graph
    mesh: MeshChoice
    hw: Hardware  # the mesh's view of the hardware (links per axis)
    ops: list[OpSpace]
    edges: list[Edge]
    base_memory: int  # bytes per device nobody chooses (constants)
    micro_batches: int = 1
    index: dict[str, int] = field(default_factory=dict)

    @property
    def space_size(self) -> float:
        return float(np.prod([float(len(o.sigs)) for o in self.ops]))

    def cost(self, assign: list[int] | np.ndarray, zero: int) -> float:
        """Seconds per step of a one-stage candidate: every op, edge and synchronisation, summed."""
        t = sum(float(o.compute[i] + o.gather[zero][i]) for o, i in zip(self.ops, assign))
        t += sum(float(e.cost[assign[e.src], assign[e.dst]]) for e in self.edges)
        t *= self.micro_batches
        return t + sum(float(o.sync[zero][i]) for o, i in zip(self.ops, assign))

    def memory(self, assign: list[int] | np.ndarray, zero: int) -> int:
        return self.base_memory + int(sum(int(o.memory[zero][i]) for o, i in zip(self.ops, assign)))

    def min_memory(self, zero: int) -> int:
        return self.base_memory + int(sum(int(o.memory[zero].min()) for o in self.ops))

    def signatures(self, assign: list[int] | np.ndarray) -> dict[str, NdSignature]:
        return {o.name: o.sigs[i] for o, i in zip(self.ops, assign)}

    def assignment(self, sigs: dict[str, NdSignature]) -> list[int]:
        """Indices of the named signatures (a preset's choices); a missing one is the all-B signature."""
        return [o.sigs.index(sigs[o.name]) if sigs.get(o.name) in o.sigs else 0 for o in self.ops]


def unit_of(module: str) -> str:
    """The layer a module belongs to: up to its first numeric path component (``blocks.3``), else its
    first component (``wte``). Pipelines cut only between such units."""
    parts = module.split(".") if module else []
    for k, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:k + 1])
    return parts[0] if parts else ""


def _states_per_param(graph: Graph) -> dict[str, int]:
    out: dict[str, int] = {}
    for op in graph.ops_in("update"):
        params = [i for i in op.inputs if graph.tensors[i].role == "param"]
        if params:
            p = params[0]
            out[p] = sum(1 for i in op.inputs if graph.tensors[i].role == "state"
                         and graph.tensors[i].shape == graph.tensors[p].shape)
    return out


def build_problem(graph: Graph, mesh: MeshChoice, hw: Hardware, micro_batches: int = 1) -> OpProblem:
    """Price every forward op of ``graph`` (a training graph, copied: placements are set on the copy)
    on ``mesh`` for every ZeRO level."""
    graph = graph.copy()
    pl = mesh.placement()
    view = mesh.hardware(hw)
    assign_placements(graph, Strategy(pl, name="search"))
    pricer = Pricer(graph, pl, view)
    states = _states_per_param(graph)
    fwd = graph.ops_in("forward")
    index = {op.name: k for k, op in enumerate(fwd)}
    owner: dict[str, tuple[int, int]] = {}  # source tensor -> (op index, input position) of its first reader
    ops: list[OpSpace] = []
    edges: list[Edge] = []
    const_bytes = 0
    for k, op in enumerate(fwd):
        sigs = signatures_of(graph, op)
        n = len(sigs)
        compute = np.array([pricer.compute_time(op, s) for s in sigs])
        gather = {z: np.zeros(n) for z in ZERO_LEVELS}
        sync = {z: np.zeros(n) for z in ZERO_LEVELS}
        act = np.array([sum(pricer.local_bytes(graph.tensors[o].meta, s.outputs[j])
                            for j, o in enumerate(op.outputs)) for s in sigs], dtype=np.int64)
        memory = {z: act.copy() for z in ZERO_LEVELS}
        for pos, t in enumerate(op.inputs):
            tn = graph.tensors[t]
            if tn.producer is not None:
                continue
            if tn.role == "const":
                if t not in owner:
                    owner[t] = (k, pos)
                    const_bytes += tn.meta.nbytes
                continue
            if t in owner:  # a second reader: an edge from the owner's layout
                edges.append(_shared_source_edge(pricer, graph, ops[owner[t][0]], owner[t][1], k, pos, sigs, t))
                continue
            owner[t] = (k, pos)
            for z in ZERO_LEVELS:
                for i, s in enumerate(sigs):
                    if tn.role == "param":
                        g, y, m = pricer.param_costs(tn.meta, s, pos, z, states.get(t, 0))
                        gather[z][i] += g
                        sync[z][i] += y
                        memory[z][i] += m
                    else:
                        memory[z][i] += pricer.local_bytes(tn.meta, s.inputs[pos])
        ops.append(OpSpace(k, op, sigs, compute, gather, sync, memory, act, unit_of(op.module)))
        for pos, t in enumerate(op.inputs):
            p = graph.tensors[t].producer
            if p is None or p not in index:
                continue
            src = ops[index[p]]
            j = graph.op_by_name[p].outputs.index(t)
            edges.append(_activation_edge(pricer, graph, src, j, k, pos, sigs, t))
    return OpProblem(graph, mesh, view, ops, edges, const_bytes, micro_batches, index)


def _activation_edge(pricer: Pricer, graph: Graph, src: OpSpace, j: int, dst: int, pos: int,
                     dst_sigs: list[NdSignature], t: str) -> Edge:
    meta = graph.tensors[t].meta
    has_grad = t in graph.tensor_grads
    outs = [s.outputs[j] for s in src.sigs]
    ins = [(s.inputs[pos], dual(s, pos) if has_grad else None) for s in dst_sigs]
    u_out, u_in = list(dict.fromkeys(outs)), list(dict.fromkeys(ins))
    small = pricer.edge_matrix(meta, tuple(u_out), tuple(u_in))
    rows = np.array([u_out.index(o) for o in outs])
    cols = np.array([u_in.index(x) for x in ins])
    cross = np.array([pricer.p2p_time(meta, o) * (2 if has_grad else 1) for o in outs])
    return Edge(src.index, dst, t, small[np.ix_(rows, cols)], cross)


def _shared_source_edge(pricer: Pricer, graph: Graph, src: OpSpace, src_pos: int, dst: int, pos: int,
                        dst_sigs: list[NdSignature], t: str) -> Edge:
    """A source read by two forward ops: the second reads it from the layout the first keeps; a
    parameter's gradient from the second reader joins the first's."""
    meta = graph.tensors[t].meta
    is_param = graph.tensors[t].role == "param"
    have = [s.inputs[src_pos] for s in src.sigs]
    ins = [(s.inputs[pos], dual(s, pos) if is_param else None) for s in dst_sigs]
    u_have, u_in = list(dict.fromkeys(have)), list(dict.fromkeys(ins))
    small = np.array([[pricer.box_time(meta, h, i) + (pricer.box_time(meta, gr, h) if gr is not None else 0.0)
                       for i, gr in u_in] for h in u_have])
    rows = np.array([u_have.index(h) for h in have])
    cols = np.array([u_in.index(x) for x in ins])
    return Edge(src.index, dst, t, small[np.ix_(rows, cols)], None)
