"""``compile``: from a torch module (or a forward graph) to everything about one parallel training step.

    import sbplab as sl
    model = sl.models.MLP(sl.models.MLPConfig())
    (x,), y = model.example_batch(8)
    c = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                   strategy=sl.presets.data_parallel(4))
    print(c.dump())                 # every tensor with its SBP and local shape
    print(c.explain("blocks_0_fc1"))  # why that op got its signature
    ex = c.executor(); loss = ex.step({"x": x, "target": y})
    with sl.LocalCluster(4) as cluster:
        result = cluster.run(c, (x, y), steps=3)   # inputs in the order of c.graph.inputs
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InputTypeError
from ..hardware import Hardware
from ..runtime.actor_plan import ActorPlan
from ..runtime.results import Batches
from .deduction.deduce import Deduction, deduce
from .deduction.presets import as_mesh
from .deduction.strategy import Strategy, bind_device
from .frontend.vocab_cross_entropy import sharded_loss, splits_vocabulary
from .ir import Graph
from .lowering.feeds import step_feeds
from .lowering.to_actors import lower_to_actors
from .physical.expand import lower
from .physical.graph import PhysicalGraph
from .physical.local_executor import LocalExecutor, initial_shards
from .physical.memory import MemoryReport, compiled_memory
from .training.optim import as_optimizer
from .training.recompute import SUFFIX, RecomputeReport, apply_recompute
from .training.training_graph import trace_training_graph, training_graph


@dataclass
class Compiled:
    """A compiled training step: the training graph, its deduction, physical graph and memory.

    It is what ``LocalCluster.run`` takes: ``plan(world_size=...)`` is its actor plan and
    ``feeds(inputs)`` checks and names the user's inputs (the runtime needs nothing else from it).
    """

    graph: Graph
    strategy: Strategy
    deduction: Deduction
    physical: PhysicalGraph
    _memory: MemoryReport | None = field(default=None, repr=False)  # made on first use (``memory``)
    recompute: RecomputeReport | None = None  # what Strategy.recompute cloned into the backward
    _plans: dict[tuple, ActorPlan] = field(default_factory=dict, init=False, repr=False, compare=False)

    def plan(self, world_size: int | None = None, registers: int | None = None, outputs: bool = False,
             order: str = "derive") -> ActorPlan:
        """The runtime's actor plan of this step (``lower_to_actors``), made once per arguments.

        world_size: ranks of the cluster it runs on (default: the ranks the strategy uses; more
            ranks idle). registers, outputs, order: see ``lower_to_actors``.
        """
        key = (world_size, registers, outputs, order)
        if key not in self._plans:
            self._plans[key] = lower_to_actors(self.physical, self.graph, registers=registers, outputs=outputs,
                                               name=self.strategy.name, world_size=world_size, order=order,
                                               bucket_mb=self.strategy.bucket_mb,
                                               schedule=self.strategy.schedule)
        return self._plans[key]

    @property
    def memory(self) -> MemoryReport:
        """Per rank, the peak memory of this step: the one memory model (register lifetimes,
        ``sim/memory_model.py``), the figure ``sl.simulate`` gives, on the hardware it was compiled for."""
        if self._memory is None:
            self._memory = compiled_memory(self, self.deduction.hardware)
        return self._memory

    def feeds(self, inputs: Any) -> Batches:
        """User inputs as the graph's named inputs, each checked against the compiled shape and dtype.

        inputs: a tuple/list in the order of ``graph.inputs`` (the module's example inputs, then the
            target), a dict by input name, the tensor itself when there is one input; or a list of
            those (one per step) or a function of the step that returns one.
        """
        return step_feeds(self.graph, inputs)

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
                  hardware: Hardware | None = None, device: str | None = None) -> Compiled:
    """Training graph (backward, optimizer) of a forward ``graph`` with a loss, deduced and lowered."""
    strategy = bind_device(strategy or Strategy(as_mesh(1), name="single device"), device)
    return compile_training_graph(training_graph(graph, strategy.micro_batches, optimizer), strategy, hardware)


def compile_training_graph(g: Graph, strategy: Strategy, hardware: Hardware | None = None) -> Compiled:
    """Deduce, lower and size a training graph ``g`` (backward and update already added); with
    ``strategy.recompute``, on a copy of ``g`` whose backward recomputes activations (``recompute.py``).
    ``strategy.precision`` is how ``g`` was traced (``trace_training_graph(..., precision=...)``)."""
    return expand_deduced(strategy, *deduce_training_graph(g, strategy, hardware))


def expand_deduced(strategy: Strategy, g: Graph, d: Deduction, report: RecomputeReport | None = None) -> Compiled:
    """The second half of ``compile_training_graph``: the deduction ``d`` of ``g`` expanded into the
    physical graph, as a Compiled step."""
    return Compiled(g, strategy, d, lower(d), recompute=report)


def deduce_training_graph(g: Graph, strategy: Strategy, hardware: Hardware | None = None
                          ) -> tuple[Graph, Deduction, RecomputeReport | None]:
    """The first half of ``compile_training_graph``: (the graph compiled, its deduction, the recomputation
    report). Apart so that a search can bound a candidate from its deduction before expanding it."""
    report = None
    if strategy.recompute != "none" and not any(op.name.endswith(SUFFIX) for op in g.ops_in("backward")):
        g = g.copy()
        report = apply_recompute(g, strategy.recompute)
    return g, deduce(g, strategy, hardware), report


def compile(model: torch.nn.Module, inputs: Any, *, target: torch.Tensor | None = None,
            loss_fn: Callable | None = None, optimizer: Any = None, strategy: Strategy | None = None,
            hardware: Hardware | None = None, capture: str = "auto", device: str | None = None) -> Compiled:
    """Trace ``model`` and compile its training step under ``strategy``.

    The arguments after ``inputs`` are keywords, in the order every entry point uses (compile, search,
    compare_with_torch, the widgets): target, loss_fn, optimizer, strategy, hardware.
    ``inputs`` and ``target`` are one full batch; with M micro-batches the module is traced
    on the first 1/M of it, so the batch size must divide by M. The step then takes batches of
    exactly this size (``step.feeds`` checks them). ``inputs`` may be a dict of keyword
    inputs, and ``loss_fn`` None when the model computes its own loss (a transformers model given
    ``labels``): ``sl.compile(model, {"input_ids": x, "labels": x})``.

    capture: "aten" (torch.export + torch's autograd, any model), "fx" (sbplab's own op library, each
        op's backward from torch's autograd), "auto" (fx where it maps the whole model, else aten); see
        ``trace_training_graph``.
    device: "cpu" or "cuda" binds a device-free strategy (presets, search results) here; None leaves it
        device-free, bound by the cluster that runs it.

    ``strategy.precision`` (mixed precision: captured under torch.autocast, fp32 master weights) and
    ``strategy.recompute`` ("full": each layer recomputed in its backward; "selective": attention
    cores) change the graph the runtime executes; see ``training/precision_pass.py`` and
    ``training/recompute.py``.
    """
    if not isinstance(model, torch.nn.Module):
        raise InputTypeError(f"sl.compile needs a torch.nn.Module (for a hand-built graph use sl.compile_graph), "
                             f"got {type(model).__name__}")
    if strategy is not None and not isinstance(strategy, Strategy):
        raise InputTypeError(f"sl.compile: strategy must be an sl.Strategy (sl.presets.data_parallel(2), ...), got "
                             f"{type(strategy).__name__}")
    strategy = bind_device(strategy or Strategy(as_mesh(1), name="single device"), device)
    optimizer = as_optimizer(optimizer)  # refused before tracing, with the sbplab optimizer to write instead
    with sharded_loss(splits_vocabulary(strategy)):  # the cross entropy written for vocabulary shards
        g = trace_training_graph(model, inputs, loss_fn, target, strategy.micro_batches, optimizer,
                                 capture=capture, precision=strategy.precision)
    return compile_training_graph(g, strategy, hardware)
