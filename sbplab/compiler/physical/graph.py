"""The physical graph: what every rank runs, in one global order, ready to lower to actors.

It is self-contained: a runtime needs nothing else to run a training step. Each ``PhysNode`` is
one op instance on one rank (a source of data or state, a compute kernel with its local
attributes, or one step of a boxing); inputs are references to other nodes' outputs, possibly on
other ranks (a ``recv`` reads its ``send`` nodes). ``PhysCollective`` lists every communication in
the one global order that every rank follows (NCCL and Gloo need the same order on every rank).

Micro-batches: a node's ``when`` says when it runs within a step: ``before`` the micro-batch
loop (sources of parameters and state, their boxing), ``each`` micro-batch (forward, backward),
or ``after`` the loop (gradient reduction, updates, write-backs). ``accumulate`` nodes (``acc``)
run each micro-batch, sum into a buffer, and their output exists after the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...placement import Placement
from ...sbp import NdSbp, fmt_sbp

NODE_KINDS = ("source", "compute", "boxing")
_BYTES: dict[tuple, int] = {}  # (shapes, dtypes) -> bytes: identical layers repeat the same shards
WHEN = ("before", "each", "after")


@dataclass(frozen=True, slots=True)
class PhysRef:
    """Output ``out`` of node ``node``."""

    node: int
    out: int = 0


@dataclass(slots=True)
class PhysNode:
    """One op instance on one rank.

    - ``kind`` "source": ``op`` is the tensor's role (input, param, state, const), ``logical`` the
      tensor, ``attrs`` has ``block`` (the global index ranges this rank holds) and ``sbp``.
    - ``kind`` "compute": ``op`` is a registry op, ``attrs`` are already localized for this rank
      (so ``get_op(op).kernel(inputs, attrs)`` is all a runtime calls), ``logical`` the logical op.
    - ``kind`` "boxing": ``op`` is the step kind (all_reduce, all_gather, reduce_scatter,
      all_to_all, slice, zero, send, recv); ``boxing``/``step`` index the deduction's boxing and
      its plan's step, ``attrs["plan_step"]`` is the ``BoxingStep`` itself (groups, transfers, bytes);
      ``collective`` the entry in the global order, if this step talks (a send or recv taking part
      in several pairs names the last; ``PhysCollective.nodes`` lists them all).
    """

    id: int
    rank: int
    kind: str
    op: str
    logical: str
    attrs: dict[str, Any]
    inputs: tuple[PhysRef, ...]
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[torch.dtype, ...]
    out_sbps: tuple[NdSbp, ...]  # the SBP each output has (what this shard is a piece of)
    phase: str
    stage: int
    when: str = "each"
    accumulate: bool = False  # acc: sums over micro-batches
    boxing: int | None = None
    step: int | None = None
    collective: int | None = None

    def check(self) -> None:
        """Kind, ``when`` and outputs valid. Called by ``PhysicalGraph`` for every node, in its one walk over
        them, rather than on construction: expansion makes a node per op and rank (millions at 64 ranks)."""
        if self.kind not in NODE_KINDS:
            raise ValueError(f"PhysNode.kind must be one of {NODE_KINDS}, got {self.kind!r}")
        if self.when not in WHEN:
            raise ValueError(f"PhysNode.when must be one of {WHEN}, got {self.when!r}")
        if len(self.out_shapes) != len(self.out_dtypes):
            raise ValueError(f"node {self.id}: {len(self.out_shapes)} output shapes but {len(self.out_dtypes)} dtypes")

    @property
    def out_bytes(self) -> int:
        key = (self.out_shapes, self.out_dtypes)
        n = _BYTES.get(key)
        if n is None:
            n = 0
            for s, d in zip(self.out_shapes, self.out_dtypes):
                k = 1
                for x in s:
                    k *= x
                n += k * d.itemsize
            _BYTES[key] = n
        return n

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.out_shapes)
        ins = ", ".join(f"n{r.node}" + (f".{r.out}" if r.out else "") for r in self.inputs)
        extra = f" coll#{self.collective}" if self.collective is not None else ""
        return (f"n{self.id} r{self.rank} {self.kind:7s} {self.op}({ins}) -> {shapes}  "
                f"[{self.logical}] {self.phase}/{self.when}{extra}")


@dataclass(frozen=True)
class PhysCollective:
    """One communication among ``group`` ranks; ``index`` is its place in the global order.

    For ``send_recv`` the group is ``(src, dst)`` and ``nodes`` are (send node, recv node).
    """

    index: int
    kind: str
    group: tuple[int, ...]
    mesh_axis: int | None
    nodes: tuple[int, ...]
    bytes_sent: dict[int, int]
    boxing: int
    step: int
    phase: str
    when: str
    reduce_op: str | None = None


@dataclass
class PhysicalGraph:
    """Every rank's op instances and the global collective order of one training step."""

    nodes: list[PhysNode]
    collectives: list[PhysCollective]
    ranks: tuple[int, ...]
    micro_batches: int
    sources: dict[str, dict[int, int]]  # tensor -> rank -> source node id
    source_sbp: dict[str, NdSbp]
    source_placement: dict[str, Placement]
    state_updates: dict[str, dict[int, PhysRef]]  # state -> rank -> its new value (after any write-back)
    loss: dict[int, PhysRef]  # rank -> the step's loss shard
    loss_sbp: NdSbp
    loss_placement: Placement
    outputs: dict[str, dict[int, PhysRef]] = field(default_factory=dict)  # gradients, by tensor name
    output_sbp: dict[str, NdSbp] = field(default_factory=dict)
    output_placement: dict[str, Placement] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kinds, whens = NODE_KINDS, WHEN
        for i, n in enumerate(self.nodes):
            if n.id != i:
                raise ValueError(f"PhysicalGraph.nodes must be numbered 0..n-1 in order; node {i} has id {n.id}")
            if n.kind not in kinds or n.when not in whens or len(n.out_shapes) != len(n.out_dtypes):
                n.check()
            for r in n.inputs:
                if r.node >= i:
                    raise ValueError(f"node {i} reads node {r.node}, which comes later: the order must be topological")
        for i, c in enumerate(self.collectives):
            if c.index != i:
                raise ValueError(f"collective {i} has index {c.index}; indices are the global order")

    def rank_nodes(self, rank: int) -> list[PhysNode]:
        """The nodes of one rank, in execution order."""
        return [n for n in self.nodes if n.rank == rank]

    def collectives_of(self, rank: int) -> list[PhysCollective]:
        return [c for c in self.collectives if rank in c.group]

    def count(self, kind: str | None = None, phase: str | None = None) -> int:
        """Number of collectives (per group) of this kind and phase."""
        return sum(1 for c in self.collectives if (kind is None or c.kind == kind) and (phase is None or c.phase == phase))

    def comm_bytes_per_rank(self) -> dict[int, int]:
        """Bytes each rank sends in one step (per-micro-batch collectives counted M times)."""
        out = {r: 0 for r in self.ranks}
        for c in self.collectives:
            k = self.micro_batches if c.when == "each" else 1
            for r, b in c.bytes_sent.items():
                out[r] = out.get(r, 0) + k * b
        return out

    def summary(self) -> str:
        kinds: dict[tuple[str, str], int] = {}
        for c in self.collectives:
            kinds[(c.phase, c.kind)] = kinds.get((c.phase, c.kind), 0) + 1
        lines = [f"physical graph: {len(self.nodes)} op instances on ranks {list(self.ranks)}, "
                 f"{len(self.collectives)} collectives, {self.micro_batches} micro-batch(es)"]
        for (phase, kind), n in sorted(kinds.items()):
            lines.append(f"  {phase:8s} {kind:14s} x{n}")
        lines.append("  bytes sent per rank per step: " + ", ".join(
            f"r{r}={b}" for r, b in sorted(self.comm_bytes_per_rank().items())))
        lines.append(f"  loss {fmt_sbp(self.loss_sbp)} on {self.loss_placement}")
        return "\n".join(lines)
