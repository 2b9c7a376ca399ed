"""Shrinking an op-level problem before solving it: followers and tied layers.

- **Followers** (Alpa merges them the same way): a cheap op (few FLOPs per output element: a reshape,
  an activation, a norm) fed by exactly one other forward op takes, for each choice of its producer,
  its own cheapest signature given that choice. It stops being a variable. An ATen-captured follower
  (a view, a transpose, a cast) takes the cheapest that reads the producer's layout as written, and is
  no follower where those differ in what they write (``_follows``).
- **Tied layers**: the repeated blocks of a model (``blocks.0``, ``blocks.1``, ...) with identical ops
  and shapes take identical choices, so one variable serves every copy (their costs add up).

Both are heuristics (a follower ignores what its consumers would prefer; a tied stack cannot vary
layer by layer); tests that compare the exact solver with exhaustive enumeration turn them off, and
the search turns them on only for large graphs. Every candidate is priced on the op-level problem in
the end, so the reduction changes which candidates are found, never what a candidate costs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..compiler.deduction.caches import freeze
from ..ops.registry import get_op
from .problem import OpProblem

CHEAP_FLOPS_PER_ELEMENT = 16  # an op doing at most this many FLOPs per output element may follow
ATEN = "aten."  # an ATen-captured op: a follower keeps its producer's layout (``_follows``)


@dataclass
class Reduced:
    """Variables (groups) with node costs, pairwise edge costs, and how to expand a choice per group
    into a signature index per op. Costs are seconds per step at one ZeRO level; memory bytes."""

    problem: OpProblem
    zero: int
    cost: list[np.ndarray]  # per group, per choice
    memory: list[np.ndarray]
    edges: dict[tuple[int, int], np.ndarray]  # (a, b), a < b: [choices of a, choices of b]
    group_of: list[int]  # per op
    mapping: list[np.ndarray]  # per op: group choice -> the op's signature index

    @property
    def sizes(self) -> list[int]:
        return [len(c) for c in self.cost]

    @property
    def space_size(self) -> float:
        return float(np.prod([float(n) for n in self.sizes]))

    def expand(self, x) -> list[int]:
        return [int(self.mapping[k][x[g]]) for k, g in enumerate(self.group_of)]

    def total(self, x) -> float:
        t = sum(float(c[x[g]]) for g, c in enumerate(self.cost))
        return t + sum(float(d[x[a], x[b]]) for (a, b), d in self.edges.items())

    def mem(self, x) -> int:
        return self.problem.base_memory + int(sum(int(m[x[g]]) for g, m in enumerate(self.memory)))

    def contract(self, op_assign: list[int]) -> list[int]:
        """A group choice per group from an op-level assignment (the choice of each group's first op
        whose mapping contains it; 0 where none does)."""
        x = [0] * len(self.cost)
        seen = set()
        for k, g in enumerate(self.group_of):
            if g in seen:
                continue
            hit = np.nonzero(self.mapping[k] == op_assign[k])[0]
            if len(hit):
                x[g] = int(hit[0])
                seen.add(g)
        return x


def _cheap(problem: OpProblem, k: int) -> bool:
    return problem.derived("cheap", _cheap_ops)[k]


def _cheap_ops(problem: OpProblem) -> list[bool]:
    return [_cheap_op(problem, k) for k in range(len(problem.ops))]


def _cheap_op(problem: OpProblem, k: int) -> bool:
    op = problem.ops[k].op
    g = problem.graph
    d = get_op(op.type)
    ins = [g.tensors[i].meta for i in op.inputs]
    outs = [g.tensors[o].meta for o in op.outputs]
    try:
        flops = d.flops(ins, outs, op.attrs)
    except Exception:
        return False
    return flops <= CHEAP_FLOPS_PER_ELEMENT * max(1, sum(m.numel for m in outs))


def _follows(problem: OpProblem, e, rows: np.ndarray) -> np.ndarray | None:
    """[choices of the producer's group, follower sigs]: 1 where the follower would read the tensor of
    edge ``e`` in another layout than its producer writes it under that choice, or None when the
    follower cannot just follow (under some choice, signatures that read the layout as written still
    differ in what they write: an embedding whose weight may be split two ways).

    A follower keeps its producer's layout: taking the cheapest signature given its incoming edge alone,
    a view after a replicated op would slice it (``B -> S(0)`` is free and the view does an eighth of the
    work) and leave its consumers to gather it back, a cost it cannot see; on an ATen graph, where views,
    transposes and casts are a third of the ops, the merged problem's optimum was ten to a hundred times
    the op-level one. Where no signature reads the layout as written, the cheapest given the edge.

    Only ATen followers keep layouts so: sbplab's own ops, traced by torch.fx, are fewer and coarser
    (a whole layer norm, a GELU), and there the cheapest choice given the edge leaves coordinate descent
    an easier landscape (within 5% of the exact optimum on the model zoo, where following was not)."""
    src, dst = problem.ops[e.src], problem.ops[e.dst]
    key = f"follows:{e.src}:{e.dst}:{e.tensor}"
    table = problem.derived(key, lambda p: _shared_changes(p, src, dst, e.tensor))
    if table is None:
        return None
    diff, unique = table
    return diff[rows] if unique[rows].all() else None


def _shared_changes(problem: OpProblem, src, dst, tensor: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``_layout_changes``, computed once per pair of signature lists and positions: identical ops share
    their lists (``op_prices.py``), so the repeated layers of a model ask the same question."""
    j, pos = src.op.outputs.index(tensor), dst.op.inputs.index(tensor)
    seen = problem.derived("layout_changes", lambda p: {})  # the lists live as long as the problem
    key = (id(src.sigs), id(dst.sigs), j, pos)
    if key not in seen:
        seen[key] = _layout_changes(src.sigs, dst.sigs, j, pos)
    return seen[key]


def _layout_changes(src_sigs, dst_sigs, j: int, pos: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(diff [producer sigs, follower sigs], unique [producer sigs]) for ``_follows``: the producer writes
    its output ``j``, the follower reads it as input ``pos``."""
    ins = [s.inputs[pos] for s in dst_sigs]
    outs_of = [s.outputs for s in dst_sigs]
    diff = np.array([[float(s.outputs[j] != i) for i in ins] for s in src_sigs])
    unique = np.array([len({outs_of[c] for c in np.nonzero(row == 0)[0]}) <= 1 for row in diff])
    return diff, unique


def _template(problem: OpProblem) -> list[tuple | None]:
    """Per op, a key shared by the corresponding op of every identical repeated layer (else None)."""
    return problem.derived("template", _templates)


def _templates(problem: OpProblem) -> list[tuple | None]:
    g = problem.graph
    units: dict[str, list[int]] = {}
    for k, o in enumerate(problem.ops):
        if re.search(r"\.\d+$", o.unit):
            units.setdefault(o.unit, []).append(k)
    shape_of = {u: tuple((problem.ops[k].op.type, tuple(g.tensors[i].meta for i in problem.ops[k].op.inputs),
                          freeze(problem.ops[k].op.attrs)) for k in ks) for u, ks in units.items()}
    out: list[tuple | None] = [None] * len(problem.ops)
    for u, ks in units.items():
        stem = re.sub(r"\.\d+$", ".#", u)
        for q, k in enumerate(ks):
            out[k] = (stem, shape_of[u], q)
    return out


def reduce_problem(problem: OpProblem, zero: int, merge: bool = True, tie: bool = True) -> Reduced:
    """Groups, their costs and edges for ``problem`` at ZeRO level ``zero`` (see the module docstring)."""
    M = problem.micro_batches
    ops = problem.ops
    node = [M * (o.compute + o.gather[zero]) + o.sync[zero] for o in ops]
    incoming: dict[int, list[int]] = {}
    for e_id, e in enumerate(problem.edges):
        incoming.setdefault(e.dst, []).append(e_id)
    group_of: list[int] = [-1] * len(ops)
    mapping: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(ops)
    cost: list[np.ndarray] = []
    memory: list[np.ndarray] = []
    absorbed: set[int] = set()
    roots: list[int] = []  # per group, its root op
    for k, o in enumerate(ops):
        ins = incoming.get(k, [])
        e = problem.edges[ins[0]] if len(ins) == 1 else None
        follows = None
        if merge and e is not None and e.cross_stage is not None and _cheap(problem, k):
            follows = _follows(problem, e, mapping[e.src]) if o.op.type.startswith(ATEN) else 0.0
        if follows is not None:
            u, g = e.src, group_of[e.src]
            total = node[k][None, :] + M * e.cost[mapping[u], :]  # [choices of g, sigs of k]
            j = (total + follows * (np.abs(total).max() + 1.0)).argmin(axis=1)
            rows = np.arange(len(j))
            group_of[k], mapping[k] = g, j
            cost[g] = cost[g] + total[rows, j]
            memory[g] = memory[g] + o.memory[zero][j]
            absorbed.add(ins[0])
            continue
        group_of[k], mapping[k] = len(cost), np.arange(len(o.sigs))
        cost.append(node[k].astype(float))
        memory.append(o.memory[zero].astype(np.int64))
        roots.append(k)
    if tie:
        group_of, cost, memory = _tie(problem, group_of, cost, memory, roots)
    edges: dict[tuple[int, int], np.ndarray] = {}
    for e_id, e in enumerate(problem.edges):
        if e_id in absorbed:
            continue
        a, b = group_of[e.src], group_of[e.dst]
        d = M * e.cost[np.ix_(mapping[e.src], mapping[e.dst])]
        if a == b:
            cost[a] = cost[a] + np.diag(d)
            continue
        if a > b:
            a, b, d = b, a, d.T
        edges[(a, b)] = edges[(a, b)] + d if (a, b) in edges else d
    return Reduced(problem, zero, cost, memory, edges, group_of, mapping)


def _tie(problem: OpProblem, group_of: list[int], cost: list[np.ndarray], memory: list[np.ndarray],
         roots: list[int]) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    keys = _template(problem)
    new_id: dict[object, int] = {}
    remap: list[int] = []
    new_cost: list[np.ndarray] = []
    new_mem: list[np.ndarray] = []
    for g, r in enumerate(roots):
        key = keys[r] if keys[r] is not None else ("own", g)
        if key not in new_id:
            new_id[key] = len(new_cost)
            new_cost.append(np.zeros_like(cost[g]))
            new_mem.append(np.zeros_like(memory[g]))
        t = new_id[key]
        remap.append(t)
        new_cost[t] = new_cost[t] + cost[g]
        new_mem[t] = new_mem[t] + memory[g]
    return [remap[g] for g in group_of], new_cost, new_mem
