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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compiler.deduction.staging import assign_placements
from ..compiler.deduction.strategy import Strategy
from ..compiler.ir import Graph, OpNode
from ..gc_pause import without_gc
from ..hardware import Hardware
from ..ops.registry import NdSignature
from .box_floors import FloorBoxes
from .box_prices import BoxPrices
from .cost import Pricer
from .mesh import MeshChoice
from .op_prices import OpPrices, OwnedSource


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
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # the sources' readers (``PricedOps``): what pricing the edges again, by another price list, needs
    shared: list[tuple[int, int, str]] = field(default_factory=list, repr=False, compare=False)
    owner: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)

    def derived(self, name: str, make: Callable[[OpProblem], Any]) -> Any:
        """``make(self)``, computed once: facts about the ops that every ZeRO level's reduction asks."""
        if name not in self._derived:
            self._derived[name] = make(self)
        return self._derived[name]

    @property
    def space_size(self) -> float:
        return float(np.prod([float(len(o.sigs)) for o in self.ops]))

    def cost(self, assign: list[int] | np.ndarray, zero: int) -> float:
        """Seconds per step of a one-stage candidate: every op, edge and synchronisation, summed."""
        f = self._flat(zero)
        a = np.asarray(assign)
        at = f.op_at + a
        t = f.per_micro[at].sum() + sum(m[a[src], a[dst]].sum() for m, src, dst in f.edge_groups)
        return float(t * self.micro_batches + f.sync[at].sum())

    def memory(self, assign: list[int] | np.ndarray, zero: int) -> int:
        f = self._flat(zero)
        return self.base_memory + int(f.memory[f.op_at + np.asarray(assign)].sum())

    def _flat(self, zero: int) -> FlatPrices:
        """The prices arranged so that pricing one assignment is a few gathers (``FlatPrices``): the final
        comparison of a space's starting points prices dozens per space."""
        return self.derived(f"flat{zero}", lambda p: FlatPrices.of(p, zero))

    def min_memory(self, zero: int) -> int:
        return self.base_memory + int(sum(int(o.memory[zero].min()) for o in self.ops))

    def signatures(self, assign: list[int] | np.ndarray) -> dict[str, NdSignature]:
        return {o.name: o.sigs[i] for o, i in zip(self.ops, assign)}

    def assignment(self, sigs: dict[str, NdSignature]) -> list[int]:
        """Indices of the named signatures (a preset's choices); a missing one is the all-B signature."""
        return [o.sigs.index(sigs[o.name]) if sigs.get(o.name) in o.sigs else 0 for o in self.ops]


@dataclass(frozen=True)
class FlatPrices:
    """``OpProblem``'s prices arranged for pricing many assignments: op k's signature i is entry
    ``op_at[k] + i`` of the op arrays (at one ZeRO level); edges are grouped by their cost table
    (identical layers share one), each group priced by one gather ``table[a[src], a[dst]]``."""

    op_at: np.ndarray
    per_micro: np.ndarray  # compute + ZeRO-3 gathers
    sync: np.ndarray
    memory: np.ndarray
    edge_groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (cost table, src ops, dst ops)

    @staticmethod
    def of(p: OpProblem, zero: int) -> FlatPrices:
        sizes = [len(o.sigs) for o in p.ops]
        op_at = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return FlatPrices(op_at, np.concatenate([o.compute + o.gather[zero] for o in p.ops]),
                          np.concatenate([o.sync[zero] for o in p.ops]),
                          np.concatenate([o.memory[zero] for o in p.ops]).astype(np.int64),
                          p.derived("edge_groups", _edge_groups))


def _edge_groups(p: OpProblem) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    groups: dict[int, tuple[np.ndarray, list[int], list[int]]] = {}
    for e in p.edges:
        g = groups.setdefault(id(e.cost), (e.cost, [], []))
        g[1].append(e.src)
        g[2].append(e.dst)
    return [(m, np.array(s, dtype=np.int64), np.array(d, dtype=np.int64)) for m, s, d in groups.values()]


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


@dataclass
class PricedOps:
    """The first half of a problem: every forward op priced, no edge yet. With its edges at their floors
    (``floor_edges``), enough for a lower bound on a pipeline's step time (``stage_floor.py``), so a stage
    space that cannot win skips its real edges, the costly half."""

    graph: Graph  # the copy placements were set on
    mesh: MeshChoice
    hw: Hardware
    prices: OpPrices | None  # None: only the sources' readers are wanted (``latency_edges``)
    ops: list[OpSpace]
    shared: list[tuple[int, int, str]]  # (reader index, input position, tensor) of sources an earlier op owns
    owner: dict[str, tuple[int, int]]  # source tensor -> (op index, input position) of its first reader
    base_memory: int
    micro_batches: int


@without_gc  # many small long-lived tables and no cycles: the collector would only re-walk them
def price_ops(graph: Graph, mesh: MeshChoice, hw: Hardware, micro_batches: int = 1,
              boxes: BoxPrices | None = None) -> PricedOps:
    """Price every forward op of ``graph`` (a training graph, copied: placements are set on the copy) on
    ``mesh`` for every ZeRO level. Identical ops (the repeated layers of a model) share their price tables
    (``op_prices.py``)."""
    graph = graph.copy()
    pl = mesh.placement()
    view = mesh.hardware(hw)
    assign_placements(graph, Strategy(pl, name="search"))
    prices = OpPrices(graph, Pricer(graph, pl, view, boxes))
    states = _states_per_param(graph)
    owner: dict[str, tuple[int, int]] = {}
    ops: list[OpSpace] = []
    shared: list[tuple[int, int, str]] = []
    const_bytes = 0
    for k, op in enumerate(graph.ops_in("forward")):
        owned: list[OwnedSource] = []
        for pos, t in enumerate(op.inputs):
            tn = graph.tensors[t]
            if tn.producer is not None:
                continue
            if tn.role == "const":
                if t not in owner:
                    owner[t] = (k, pos)
                    const_bytes += tn.meta.nbytes
                continue
            if t in owner:
                shared.append((k, pos, t))
                continue
            owner[t] = (k, pos)
            owned.append((pos, tn.role == "param", tn.meta, states.get(t, 0)))
        node = prices.node(op, tuple(owned))
        ops.append(OpSpace(k, op, node.sigs, node.compute, node.gather, node.sync, node.memory, node.activation,
                           unit_of(op.module)))
    return PricedOps(graph, mesh, view, prices, ops, shared, owner, const_bytes, micro_batches)


@without_gc
def build_problem(graph: Graph, mesh: MeshChoice, hw: Hardware, micro_batches: int = 1,
                  boxes: BoxPrices | None = None, priced: PricedOps | None = None) -> OpProblem:
    """Price every forward op of ``graph`` (``price_ops``, or ``priced`` if it was done already) and every
    edge between forward ops. ``boxes``: boxing prices to share with other meshes of the search."""
    p = priced or price_ops(graph, mesh, hw, micro_batches, boxes)
    return OpProblem(p.graph, p.mesh, p.hw, p.ops, edges_of(p, p.prices), p.base_memory, micro_batches,
                     {o.name: o.index for o in p.ops}, shared=p.shared, owner=p.owner)


def floor_edges(p: PricedOps, latency_only: bool = False) -> list[Edge]:
    """``p``'s edges priced by floors (``box_floors.py``) instead of route searches: no price is above the
    real one, and the whole set costs a few array lookups per layout pair. ``latency_only``: each at the
    least latency rounds of its boxings' routes, the part a smaller tensor does not make shorter."""
    prices = OpPrices(p.graph, Pricer(p.graph, p.mesh.placement(), p.hw, FloorBoxes(latency_only)))
    return edges_of(p, prices)


def latency_edges(p: PricedOps | OpProblem) -> list[Edge]:
    """The edges of ``p`` (priced ops, or the problem made of them), in the order ``edges_of`` gives, at the
    least latency rounds of their boxings and moves (``floor_edges``)."""
    return floor_edges(PricedOps(p.graph, p.mesh, p.hw, None, p.ops, p.shared, p.owner, p.base_memory,
                                 p.micro_batches), True)


def edges_of(p: PricedOps, prices: OpPrices) -> list[Edge]:
    """Every edge between ``p``'s forward ops, priced by ``prices``."""
    g, ops = p.graph, p.ops
    index = {o.name: o.index for o in ops}
    shared: dict[int, list[tuple[int, str]]] = {}
    for k, pos, t in p.shared:
        shared.setdefault(k, []).append((pos, t))
    edges: list[Edge] = []
    for dst in ops:
        for pos, t in shared.get(dst.index, ()):  # a second reader: an edge from the owner's layout
            src = ops[p.owner[t][0]]
            edges.append(Edge(src.index, dst.index, t, prices.shared_source_edge(
                src.op, src.sigs, p.owner[t][1], dst.op, pos, dst.sigs, t), None))
        for pos, t in enumerate(dst.op.inputs):
            producer = g.tensors[t].producer
            if producer is None or producer not in index:
                continue
            src = ops[index[producer]]
            j = g.op_by_name[producer].outputs.index(t)
            cost, cross = prices.activation_edge(src.op, src.sigs, j, dst.op, pos, dst.sigs, t)
            edges.append(Edge(src.index, dst.index, t, cost, cross))
    return edges
