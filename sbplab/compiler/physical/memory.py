"""Per-device memory of a training step: parameters, gradients, optimizer state, activations.

Parameters and optimizer state live for the whole run; everything else a rank computes (forward
activations, boxed copies, backward temporaries, gradients) is allocated when its node runs and
freed after the last node on that rank that reads it. Walking each rank's nodes in order gives
the lifetimes and the peak. Under a pipeline, the forward activations of up to M micro-batches
are alive at once (GPipe's schedule, all forwards then all backwards), which the report counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...fmt import fmt_bytes
from ...gc_pause import without_gc
from ...layout import local_shape
from ..deduction.deduce import Deduction
from .graph import PhysicalGraph


@dataclass(slots=True)
class Lifetime:
    """Bytes held by one node's outputs from ``start`` to ``end`` (positions in the rank's order)."""

    label: str
    start: int
    end: int
    bytes: int
    phase: str


@dataclass
class RankMemory:
    rank: int
    params: int  # bytes of parameter shards stored on this rank
    grads: int  # bytes of the final (reduced) gradient shards
    optimizer_state: int  # bytes of optimizer state shards
    activations_peak: int  # peak bytes of everything computed during one micro-batch's step
    micro_batches_in_flight: int  # GPipe: micro-batches whose forward activations coexist
    forward_activations: int  # bytes of forward outputs one micro-batch keeps for its backward
    lifetimes: list[Lifetime] = field(default_factory=list)

    @property
    def peak(self) -> int:
        extra = (self.micro_batches_in_flight - 1) * self.forward_activations
        return self.params + self.optimizer_state + self.activations_peak + extra


@dataclass
class MemoryReport:
    ranks: dict[int, RankMemory]

    def table(self) -> str:
        rows = [("rank", "params", "grads", "optim state", "activ. peak", "in flight", "peak")]
        for r, m in sorted(self.ranks.items()):
            rows.append((str(r), fmt_bytes(m.params), fmt_bytes(m.grads), fmt_bytes(m.optimizer_state), fmt_bytes(m.activations_peak),
                         str(m.micro_batches_in_flight), fmt_bytes(m.peak)))
        w = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        return "\n".join("  ".join(v.rjust(x) for v, x in zip(row, w)) for row in rows)




@without_gc
def memory_report(d: Deduction, phys: PhysicalGraph) -> MemoryReport:
    g = d.graph
    grad_names = set(g.grads.values())
    pipelined = d.strategy.n_stages > 1
    out: dict[int, RankMemory] = {}
    nodes = phys.nodes
    read_in_backward = {ref.node for n in nodes if n.phase == "backward" for ref in n.inputs}
    last_use: dict[int, dict[int, int]] = {r: {} for r in phys.ranks}
    order: dict[int, list[int]] = {r: [] for r in phys.ranks}
    for n in nodes:
        mine = order[n.rank]
        pos = len(mine)
        mine.append(n.id)
        if n.inputs:
            last = last_use[n.rank]
            for ref in n.inputs:
                if nodes[ref.node].rank == n.rank:
                    last[ref.node] = pos
    for r in phys.ranks:
        params = state = grads = fwd = 0
        live, peak, lifetimes = 0, 0, []
        frees: dict[int, int] = {}
        ids = order[r]
        last = last_use[r]
        for pos, nid in enumerate(ids):
            n = nodes[nid]
            if n.kind == "source":
                role = n.op
                if role == "param":
                    params += n.out_bytes
                elif role == "state":
                    state += n.out_bytes
                continue
            end = last.get(nid, len(ids))
            b = n.out_bytes
            live += b
            if live > peak:
                peak = live
            frees[end] = frees.get(end, 0) + b
            lifetimes.append(Lifetime(n.logical if n.kind == "compute" else f"box {n.logical}", pos, end, b, n.phase))
            if n.phase == "forward" and n.when == "each" and nid in read_in_backward:
                fwd += b
            live -= frees.pop(pos, 0)
        for gname in grad_names:
            pl = d.placement[gname]
            if r in pl:
                m = g.tensors[gname].meta
                k = 1
                for s in local_shape(m.shape, pl, d.sbp[gname], r):
                    k *= s
                grads += k * m.dtype.itemsize
        out[r] = RankMemory(r, params, grads, state, peak, g.micro_batches if pipelined else 1, fwd, lifetimes)
    return MemoryReport(out)
