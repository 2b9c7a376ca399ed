"""LocalExecutor: one training step of a physical graph, every rank's shard held in this process.

It runs exactly the physical graph: compute nodes with their localized attributes, boxing steps
through their kinds' own code (``step.kind_obj.run_in_process``: collectives and sends/receives
posted by every rank on its in-process communicator, the same ``start`` the workers post on Gloo or
NCCL, the tensors moved between the ranks' buffers by one ``InProcessWorld``), sends and receives between stages,
micro-batches with ``acc`` accumulation, and the write-back of parameters and optimizer state.
Nothing here reassembles a full tensor except to report the loss and parameters to the user, so
a wrong signature or boxing shows up as a wrong number, not a hidden fix.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...layout import assemble, shard
from ...ops.registry import get_op
from ...runtime.communicators import InProcessWorld
from ..ir import Graph, GraphError
from .graph import PhysicalGraph

Unit = tuple[str, list[int]]  # ("compute", [node]) or ("step", [nodes of one boxing step])


def _units(phys: PhysicalGraph) -> dict[str, list[Unit]]:
    out: dict[str, list[Unit]] = {"before": [], "each": [], "after": []}
    steps: dict[tuple[int, int], list[int]] = {}
    for n in phys.nodes:
        if n.kind == "source":
            continue
        if n.kind == "compute":
            out[n.when].append(("compute", [n.id]))
            continue
        key = (n.boxing, n.step)
        if key not in steps:
            steps[key] = []
            out[n.when].append(("step", steps[key]))
        steps[key].append(n.id)
    return out


def initial_shards(phys: PhysicalGraph, graph: Graph) -> dict[str, dict[int, torch.Tensor]]:
    """Every parameter, optimizer state and constant cut into its ranks' shards, as the step starts."""
    out = {}
    for name, per_rank in phys.sources.items():
        t = graph.tensors[name]
        if t.role != "input":
            shards = shard(t.initial_value(), phys.source_placement[name], phys.source_sbp[name], f"tensor {name!r}")
            out[name] = {r: shards[r] for r in per_rank}
    return out


class LocalExecutor:
    """Runs training steps of ``phys`` (lowered from ``graph``) for all ranks in one process."""

    def __init__(self, phys: PhysicalGraph, graph: Graph) -> None:
        self.phys, self.graph = phys, graph
        self.units = _units(phys)
        self.world = InProcessWorld(phys.ranks)  # every rank's communicator, groups made as steps need them
        self.state = initial_shards(phys, graph)
        self.last: dict[int, tuple[torch.Tensor, ...]] = {}

    # --- running --------------------------------------------------------------------------------
    def _run(self, unit: Unit, vals: dict[int, tuple[torch.Tensor, ...]]) -> None:
        kind, ids = unit
        nodes = [self.phys.nodes[i] for i in ids]
        if kind == "compute":
            n = nodes[0]
            ins = [vals[r.node][r.out] for r in n.inputs]
            vals[n.id] = tuple(get_op(n.op).kernel(ins, dict(n.attrs)))
            return
        step = nodes[0].attrs["plan_step"]
        shape = self.graph.tensors[nodes[0].logical].shape
        if step.mesh_axis is not None:
            out = step.kind_obj.run_in_process(step, {n.rank: vals[n.inputs[0].node][n.inputs[0].out] for n in nodes},
                                               shape, self.world)
            for n in nodes:
                vals[n.id] = (out[n.rank],)
            return
        shards: dict[int, torch.Tensor] = {}
        for n in nodes:
            if n.op == "send":
                shards[n.rank] = vals[n.inputs[0].node][n.inputs[0].out]
            elif n.attrs.get("local_input") is not None:
                r = n.inputs[n.attrs["local_input"]]
                shards[n.rank] = vals[r.node][r.out]
        out = step.kind_obj.run_in_process(step, shards, shape, self.world)
        for n in nodes:
            vals[n.id] = (out[n.rank],) if n.op == "recv" else ()

    def step(self, feeds: Mapping[str, torch.Tensor]) -> float:
        """One training step on the full batch ``feeds`` (input name -> tensor); returns the loss."""
        phys, g = self.phys, self.graph
        m = phys.micro_batches
        chunks = self._chunks(feeds, m)
        self.world.reset()  # a step that failed half-way left nothing behind
        vals: dict[int, tuple[torch.Tensor, ...]] = {}
        for name, per_rank in phys.sources.items():
            if name in self.state:
                for r, nid in per_rank.items():
                    vals[nid] = (self.state[name][r],)
        for u in self.units["before"]:
            self._run(u, vals)
        acc: dict[int, tuple[torch.Tensor, ...]] = {}
        acc_nodes = [i for _, ids in self.units["each"] for i in ids if phys.nodes[i].accumulate]
        for k in range(m):
            for name, per_rank in phys.sources.items():
                if g.tensors[name].role == "input":
                    sh = shard(chunks[name][k], phys.source_placement[name], phys.source_sbp[name], f"input {name!r}")
                    for r, nid in per_rank.items():
                        vals[nid] = (sh[r],)
            for u in self.units["each"]:
                self._run(u, vals)
            for i in acc_nodes:
                acc[i] = vals[i] if i not in acc else tuple(a + v for a, v in zip(acc[i], vals[i]))
        vals.update(acc)
        for u in self.units["after"]:
            self._run(u, vals)
        self.last = vals
        for name, per_rank in phys.state_updates.items():
            for r, ref in per_rank.items():
                self.state[name][r] = vals[ref.node][ref.out]
        loss = assemble({r: vals[ref.node][ref.out] for r, ref in phys.loss.items()}, phys.loss_placement,
                        phys.loss_sbp)
        return float(loss)

    def _chunks(self, feeds: Mapping[str, torch.Tensor], m: int) -> dict[str, list[torch.Tensor]]:
        out = {}
        for name in self.graph.inputs:
            if name not in self.phys.sources:
                continue
            if name not in feeds:
                raise GraphError(f"input {name!r} was not fed; the step needs {self.graph.inputs}")
            full = feeds[name]
            want = self.graph.tensors[name].shape
            if tuple(full.shape[1:]) != want[1:] or full.shape[0] != want[0] * m:
                raise GraphError(f"input {name!r} has shape {tuple(full.shape)}; this graph takes "
                                 f"({want[0] * m}, ...) = {m} micro-batch(es) of {want}")
            out[name] = list(full.split(want[0]))
        return out

    # --- reading results ----------------------------------------------------------------------------
    def value(self, name: str) -> torch.Tensor:
        """The full value of a parameter or optimizer state, assembled from its shards."""
        if name not in self.state:
            raise KeyError(f"{name!r} is not a parameter or state of this graph")
        return assemble(self.state[name], self.phys.source_placement[name], self.phys.source_sbp[name])

    def params(self) -> dict[str, torch.Tensor]:
        return {p: self.value(p) for p in self.graph.params if p in self.state}

    def grad(self, param: str) -> torch.Tensor:
        """The last step's gradient of ``param`` (summed over micro-batches), assembled."""
        if not self.last:
            raise GraphError("no step has run yet")
        g = self.graph.grads[param]
        shards = {r: self.last[ref.node][ref.out] for r, ref in self.phys.outputs[g].items()}
        return assemble(shards, self.phys.output_placement[g], self.phys.output_sbp[g])
