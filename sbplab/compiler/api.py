"""``compile``: from a torch module (or a forward graph) to everything about one parallel training step.

    import sbplab as sl
    model = sl.models.MLP(sl.models.MLPConfig())
    (x,), y = model.example_batch(8)
    c = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                   strategy=sl.presets.data_parallel(4))
    print(c.dump())                 # every tensor with its SBP and local shape
    print(c.explain("blocks_0_fc1"))  # why that op got its signature
    ex = c.executor(); loss = ex.step({"x": x, "target": y})
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..cluster import Cluster
from .autodiff import add_backward
from .deduce import Deduction, deduce
from .executor import LocalExecutor, initial_shards
from .fx_frontend import from_torch
from .ir import Graph, GraphError
from .lower import lower
from .memory import MemoryReport, memory_report
from .optim import SGD
from .physical import PhysicalGraph
from .presets import as_mesh
from .strategy import Strategy


@dataclass
class Compiled:
    """A compiled training step: the training graph, its deduction, physical graph and memory."""

    graph: Graph
    strategy: Strategy
    deduction: Deduction
    physical: PhysicalGraph
    memory: MemoryReport

    def executor(self) -> LocalExecutor:
        """An in-process executor holding every rank's shards (fresh parameter values)."""
        return LocalExecutor(self.physical, self.graph)

    def initial_shards(self) -> dict[str, dict[int, torch.Tensor]]:
        """Parameter, state and constant shards per rank, to start a runtime from."""
        return initial_shards(self.physical, self.graph)

    def dump(self, phases: tuple[str, ...] = ("forward", "backward", "update")) -> str:
        return self.graph.dump(self.deduction, phases)

    def explain(self, op: str) -> str:
        return self.deduction.explain(op)

    def summary(self) -> str:
        g = self.graph
        return "\n".join([
            f"{self.strategy.name}: {len(g.ops)} logical ops ({len(g.ops_in('forward'))} forward, "
            f"{len(g.ops_in('backward'))} backward, {len(g.ops_in('update'))} update), "
            f"{len(g.params)} params, {g.micro_batches} micro-batch(es)",
            f"{len(self.deduction.boxings)} boxings, {self.deduction.total_bytes()} B of boxing per micro-batch step",
            self.physical.summary(),
            self.memory.table(),
        ])


def compile_graph(graph: Graph, optimizer: Any = None, strategy: Strategy | None = None,
                  cluster: Cluster | None = None) -> Compiled:
    """Training graph (backward, optimizer) of a forward ``graph`` with a loss, deduced and lowered."""
    strategy = strategy or Strategy(as_mesh(1), name="single device")
    g = graph.copy()
    add_backward(g, strategy.micro_batches)
    (optimizer or SGD()).build(g)
    d = deduce(g, strategy, cluster)
    phys = lower(d)
    return Compiled(g, strategy, d, phys, memory_report(d, phys))


def compile(module: torch.nn.Module, example_inputs: Any, loss_fn: Callable | None = None,
            target: torch.Tensor | None = None, optimizer: Any = None, strategy: Strategy | None = None,
            cluster: Cluster | None = None) -> Compiled:
    """Trace ``module`` and compile its training step under ``strategy``.

    ``example_inputs`` and ``target`` are one full batch; with M micro-batches the module is traced
    on the first 1/M of it, so the batch size must divide by M.
    """
    strategy = strategy or Strategy(as_mesh(1), name="single device")
    m = strategy.micro_batches
    xs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    tensors = list(xs) + ([target] if target is not None else [])
    for t in tensors:
        if t.shape[0] % m:
            raise GraphError(f"batch size {t.shape[0]} does not divide into {m} micro-batches")
    xs = tuple(t[: t.shape[0] // m] for t in xs)
    tgt = target[: target.shape[0] // m] if target is not None else None
    return compile_graph(from_torch(module, xs, loss_fn, tgt), optimizer, strategy, cluster)
