"""Per-op and per-edge price tables for one mesh, each computed once per distinct question.

A 24-layer GPT has 24 copies of every block op: same type, input shapes, attributes, backward ops
and parameter shapes, so the same signature list and the same prices. ``build_problem`` asks
``OpPrices`` for each op and edge; the answer is keyed on what the prices depend on (not on the op's
name), so identical layers share one set of arrays. The arrays are read-only: every user combines
them into new ones, and one layer cannot change another's prices by accident.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compiler.deduction.caches import freeze
from ..compiler.deduction.signature_hints import signatures_of
from ..compiler.ir import Graph, OpNode
from ..ops.registry import NdSignature, TensorMeta
from .cost import ZERO_LEVELS, Pricer, dual

# a source an op reads first (so its node pays for it): (input position, is a parameter, meta, optimizer states)
OwnedSource = tuple[int, bool, TensorMeta, int]


@dataclass(frozen=True)
class NodePrices:
    """An op's signatures and, per signature, what it costs (see ``problem.OpSpace``)."""

    sigs: list[NdSignature]
    compute: np.ndarray
    gather: dict[int, np.ndarray]
    sync: dict[int, np.ndarray]
    memory: dict[int, np.ndarray]
    activation: np.ndarray


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class OpPrices:
    """Node and edge tables of one training graph on one mesh (``pricer``), shared by identical ops."""

    def __init__(self, graph: Graph, pricer: Pricer) -> None:
        self.graph, self.pricer = graph, pricer
        self._nodes: dict[tuple, NodePrices] = {}
        self._edges: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}
        self._keys: dict[str, tuple] = {}

    def sig_key(self, op: OpNode) -> tuple:
        """What an op's signature list depends on (its mesh is the pricer's)."""
        k = self._keys.get(op.name)
        if k is None:
            g = self.graph
            k = self._keys[op.name] = (op.type, tuple(g.tensors[i].meta for i in op.inputs), freeze(op.attrs))
        return k

    def node(self, op: OpNode, owned: tuple[OwnedSource, ...]) -> NodePrices:
        """``op``'s prices, its node paying for the sources in ``owned`` (those it reads first)."""
        op_key = self.pricer.compute_key(op)
        key = (op_key, tuple(self.graph.tensors[o].meta for o in op.outputs), owned)
        got = self._nodes.get(key)
        if got is None:
            got = self._nodes[key] = self._node(op, op_key, owned)
        return got

    def _node(self, op: OpNode, op_key: tuple, owned: tuple[OwnedSource, ...]) -> NodePrices:
        pricer, graph = self.pricer, self.graph
        sigs = signatures_of(graph, op)
        n = len(sigs)
        compute = np.array([pricer.compute_time(op, s, op_key) for s in sigs])
        gather = {z: np.zeros(n) for z in ZERO_LEVELS}
        sync = {z: np.zeros(n) for z in ZERO_LEVELS}
        act = np.array([sum(pricer.local_bytes(graph.tensors[o].meta, s.outputs[j])
                            for j, o in enumerate(op.outputs)) for s in sigs], dtype=np.int64)
        memory = {z: act.copy() for z in ZERO_LEVELS}
        for pos, is_param, meta, n_states in owned:
            for z in ZERO_LEVELS:
                for i, s in enumerate(sigs):
                    if is_param:
                        g, y, m = pricer.param_costs(meta, s, pos, z, n_states)
                        gather[z][i] += g
                        sync[z][i] += y
                        memory[z][i] += m
                    else:
                        memory[z][i] += pricer.local_bytes(meta, s.inputs[pos])
        return NodePrices(sigs, _frozen(compute), {z: _frozen(a) for z, a in gather.items()},
                          {z: _frozen(a) for z, a in sync.items()}, {z: _frozen(a) for z, a in memory.items()},
                          _frozen(act))

    def activation_edge(self, src_op: OpNode, src_sigs: list[NdSignature], j: int, dst_op: OpNode, pos: int,
                        dst_sigs: list[NdSignature], t: str) -> tuple[np.ndarray, np.ndarray]:
        """(cost [src sigs, dst sigs], stage-to-stage move [src sigs]) of output ``j`` of ``src_op``
        read as input ``pos`` of ``dst_op``."""
        meta = self.graph.tensors[t].meta
        has_grad = t in self.graph.tensor_grads
        reread = self.pricer.rereads(dst_op, pos)
        key = ("act", self.sig_key(src_op), j, self.sig_key(dst_op), pos, meta, has_grad, reread)
        got = self._edges.get(key)
        if got is None:
            got = self._edges[key] = self._activation_edge(src_sigs, j, pos, dst_sigs, meta, has_grad, reread)
        return got  # type: ignore[return-value]

    def _activation_edge(self, src_sigs: list[NdSignature], j: int, pos: int, dst_sigs: list[NdSignature],
                         meta: TensorMeta, has_grad: bool, reread: bool) -> tuple[np.ndarray, np.ndarray]:
        pricer = self.pricer
        outs = [s.outputs[j] for s in src_sigs]
        ins = [(s.inputs[pos], dual(s, pos) if has_grad else None) for s in dst_sigs]
        u_out, u_in = list(dict.fromkeys(outs)), list(dict.fromkeys(ins))
        small = pricer.edge_matrix(meta, tuple(u_out), tuple(u_in), reread)
        rows = _positions(outs, u_out)
        cols = _positions(ins, u_in)
        cross = np.array([pricer.p2p_time(meta, o) * (2 if has_grad else 1) for o in outs])
        return _frozen(small[np.ix_(rows, cols)]), _frozen(cross)

    def shared_source_edge(self, src_op: OpNode, src_sigs: list[NdSignature], src_pos: int, dst_op: OpNode,
                           pos: int, dst_sigs: list[NdSignature], t: str) -> np.ndarray:
        """A source read by two forward ops: the second reads it from the layout the first keeps; a
        parameter's gradient from the second reader joins the first's. Cost [src sigs, dst sigs]."""
        meta = self.graph.tensors[t].meta
        is_param = self.graph.tensors[t].role == "param"
        reread = self.pricer.rereads(dst_op, pos)
        key = ("shared", self.sig_key(src_op), src_pos, self.sig_key(dst_op), pos, meta, is_param, reread)
        got = self._edges.get(key)
        if got is None:
            got = self._edges[key] = (self._shared_source_edge(src_sigs, src_pos, pos, dst_sigs, meta, is_param,
                                                               reread), None)
        return got[0]

    def _shared_source_edge(self, src_sigs: list[NdSignature], src_pos: int, pos: int,
                            dst_sigs: list[NdSignature], meta: TensorMeta, is_param: bool,
                            reread: bool) -> np.ndarray:
        pricer = self.pricer
        have = [s.inputs[src_pos] for s in src_sigs]
        ins = [(s.inputs[pos], dual(s, pos) if is_param else None) for s in dst_sigs]
        u_have, u_in = list(dict.fromkeys(have)), list(dict.fromkeys(ins))
        small = pricer.read_matrix(meta, u_have, u_in, reread, u_have)
        rows = _positions(have, u_have)
        cols = _positions(ins, u_in)
        return _frozen(small[np.ix_(rows, cols)])


def _positions(items: list, uniques: list) -> np.ndarray:
    """Where each of ``items`` sits in ``uniques`` (its distinct values, in first-seen order)."""
    at = {u: k for k, u in enumerate(uniques)}
    return np.array([at[x] for x in items], dtype=np.int64)
