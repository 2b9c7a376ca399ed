"""The logical graph: tensors and ops with global shapes, before anything is split over devices.

One class serves the forward graph a frontend builds and the training graph autodiff extends: an op
carries its phase (forward, backward, update), so later passes treat them alike. Tensors know their
role, because a parameter, a data input and an optimizer state are placed and hinted differently.
The text dump reads like an FX printout, with SBP and local shape beside each tensor once deduced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import SbplabError
from ..freeze import freeze
from ..ops.registry import TensorMeta, get_op
from ..placement import Placement

ROLES = ("input", "param", "const", "state", "activation", "grad")
PHASES = ("forward", "backward", "update")


class GraphError(SbplabError, ValueError):
    """A graph is malformed: unknown tensor, duplicate name, shape inference failed."""


@dataclass
class TensorNode:
    """A logical tensor: global shape and dtype, who makes it and who reads it."""

    name: str
    meta: TensorMeta
    role: str
    producer: str | None = None  # op name; None for inputs, params, consts, states
    consumers: list[str] = field(default_factory=list)
    value: torch.Tensor | None = None  # initial value of params, states and consts
    module: str = ""  # module path the tensor belongs to ("blocks.0.mlp.fc1")
    init: str = ""  # "zeros": the initial value is zeros, made when needed (optimizer state)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"tensor {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.value is not None and tuple(self.value.shape) != self.meta.shape:
            raise ValueError(
                f"tensor {self.name!r}: value has shape {tuple(self.value.shape)} but the tensor "
                f"is declared {self.meta.shape}"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape

    def initial_value(self) -> torch.Tensor:
        """The value a step starts from (params, states, consts); zeros are made on demand."""
        if self.value is not None:
            return self.value
        if self.init == "zeros":
            return torch.zeros(self.meta.shape, dtype=self.meta.dtype)
        raise GraphError(f"tensor {self.name!r} ({self.role}) has no initial value")

    @property
    def is_source(self) -> bool:
        return self.producer is None


@dataclass
class OpNode:
    """One registry op applied to named tensors."""

    name: str
    type: str  # registry op name
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    phase: str = "forward"
    module: str = ""  # module path that made it
    source: str = ""  # "file.py:42" of the user code that made it, when known
    placement: Placement | None = None  # set by the strategy
    stage: int = 0  # pipeline stage
    forward_op: str | None = None  # for backward ops: the forward op they differentiate

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"op {self.name!r}: phase must be one of {PHASES}, got {self.phase!r}")

    @property
    def per_micro_batch(self) -> bool:
        """Forward and backward ops run once per micro-batch; updates run once per step."""
        return self.phase != "update"


class Graph:
    """A logical graph in topological order.

    ``inputs`` are the data fed each step (batch, targets), ``params`` the trainable tensors;
    ``state_updates`` maps a state tensor (parameter, optimizer state) to the tensor that replaces
    it after a step. ``micro_batches`` says how many times forward and backward run per step.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, TensorNode] = {}
        self.ops: list[OpNode] = []
        self.op_by_name: dict[str, OpNode] = {}
        self.inputs: list[str] = []
        self.params: list[str] = []
        self.outputs: list[str] = []
        self.loss: str | None = None  # the scalar loss of one micro-batch
        self.loss_value: str | None = None  # the loss of the whole step (after acc when micro-batched)
        self.state_updates: dict[str, str] = {}
        self.micro_batches: int = 1
        self.grads: dict[str, str] = {}  # param -> its (accumulated) gradient tensor
        self.tensor_grads: dict[str, str] = {}  # forward tensor -> its total gradient (one micro-batch)
        self.input_grads: dict[str, tuple[str | None, ...]] = {}  # forward op -> its rule's gradient per input
        self._counts: dict[str, int] = {}

    # --- construction --------------------------------------------------------------------------
    def fresh_name(self, base: str) -> str:
        base = base or "t"
        if base not in self.tensors and base not in self.op_by_name:
            self._counts.setdefault(base, 0)
            return base
        n = self._counts.get(base, 0)
        while True:
            n += 1
            cand = f"{base}_{n}"
            if cand not in self.tensors and cand not in self.op_by_name:
                self._counts[base] = n
                return cand

    def add_tensor(self, name: str, shape: Sequence[int], role: str, dtype: torch.dtype = torch.float32,
                   value: torch.Tensor | None = None, module: str = "", init: str = "") -> TensorNode:
        if name in self.tensors:
            raise GraphError(f"a tensor named {name!r} already exists")
        t = TensorNode(name, TensorMeta(tuple(int(s) for s in shape), dtype), role, value=value,
                       module=module, init=init)
        self.tensors[name] = t
        if role == "input":
            self.inputs.append(name)
        elif role == "param":
            self.params.append(name)
        return t

    def add_op(self, type: str, inputs: Sequence[str], attrs: Mapping[str, Any] | None = None, *,
               name: str | None = None, out_names: Sequence[str] | None = None, phase: str = "forward",
               module: str = "", source: str = "", role: str = "activation",
               forward_op: str | None = None) -> OpNode:
        """Append an op; output shapes come from the registry's inference."""
        opdef = get_op(type)
        attrs = {k: freeze(v) for k, v in (attrs or {}).items()}
        for i in inputs:
            if i not in self.tensors:
                raise GraphError(f"op {type!r} reads {i!r}, which is not a tensor of this graph")
        metas = [self.tensors[i].meta for i in inputs]
        where = f" (made at {source})" if source else ""
        try:
            outs = opdef.infer(metas, attrs)
        except (ValueError, RuntimeError, IndexError, TypeError) as e:
            shapes = ", ".join(f"{i}: {tuple(m.shape)}" for i, m in zip(inputs, metas))
            raise GraphError(f"op {type}({shapes}) with {attrs}{where}: {e}") from e
        op_name = self.fresh_name(name or type)
        if out_names is None:
            out_names = [op_name] if len(outs) == 1 else [f"{op_name}.{j}" for j in range(len(outs))]
        if len(out_names) != len(outs):
            raise GraphError(f"op {type!r} makes {len(outs)} outputs but {len(out_names)} names were given")
        node = OpNode(op_name, type, list(inputs), [], attrs, phase, module, source, forward_op=forward_op)
        self.op_by_name[op_name] = node
        for n, m in zip(out_names, outs):
            n = n if n not in self.tensors else self.fresh_name(n)
            self.tensors[n] = TensorNode(n, m, role, producer=op_name, module=module)
            node.outputs.append(n)
        for i in inputs:
            self.tensors[i].consumers.append(op_name)
        self.ops.append(node)
        return node

    def rename_tensor(self, old: str, new: str) -> None:
        """Give a tensor a readable name after the fact (a parameter's gradient becomes ``w.grad``)."""
        if new in self.tensors:
            raise GraphError(f"cannot rename {old!r} to {new!r}: that name is taken")
        t = self.tensors.pop(old)
        t.name = new
        self.tensors[new] = t
        if t.producer:
            op = self.op_by_name[t.producer]
            op.outputs = [new if o == old else o for o in op.outputs]
        for c in t.consumers:
            op = self.op_by_name[c]
            op.inputs = [new if i == old else i for i in op.inputs]
        for lst in (self.inputs, self.params, self.outputs):
            lst[:] = [new if x == old else x for x in lst]
        if self.loss == old:
            self.loss = new
        if self.loss_value == old:
            self.loss_value = new
        for k, v in list(self.tensor_grads.items()):
            if v == old:
                self.tensor_grads[k] = new
        for k, gs in list(self.input_grads.items()):
            if old in gs:
                self.input_grads[k] = tuple(new if x == old else x for x in gs)

    # --- queries -------------------------------------------------------------------------------
    def producer(self, tensor: str) -> OpNode | None:
        p = self.tensors[tensor].producer
        return self.op_by_name[p] if p else None

    def consumers(self, tensor: str) -> list[OpNode]:
        return [self.op_by_name[c] for c in self.tensors[tensor].consumers]

    def sources(self) -> list[str]:
        """Tensors nobody computes: inputs, params, consts and states, in declaration order."""
        return [n for n, t in self.tensors.items() if t.producer is None]

    def ops_in(self, phase: str) -> list[OpNode]:
        return [o for o in self.ops if o.phase == phase]

    def validate(self) -> None:
        """Every op reads tensors made earlier: the op list is a topological order."""
        seen = set(self.sources())
        for op in self.ops:
            for i in op.inputs:
                if i not in seen:
                    raise GraphError(f"op {op.name!r} reads {i!r} before it is made")
            seen.update(op.outputs)
        for old, new in self.state_updates.items():
            if self.tensors[old].meta != self.tensors[new].meta:
                raise GraphError(f"state {old!r} is replaced by {new!r} of a different shape or dtype")

    def copy(self) -> Graph:
        """A structural copy (tensor values are shared, not cloned)."""
        g = Graph()
        for n, t in self.tensors.items():
            g.tensors[n] = TensorNode(t.name, t.meta, t.role, t.producer, list(t.consumers), t.value, t.module, t.init)
        for op in self.ops:
            c = OpNode(op.name, op.type, list(op.inputs), list(op.outputs), dict(op.attrs), op.phase,
                       op.module, op.source, op.placement, op.stage, op.forward_op)
            g.ops.append(c)
            g.op_by_name[c.name] = c
        g.inputs, g.params, g.outputs = list(self.inputs), list(self.params), list(self.outputs)
        g.loss, g.state_updates, g.grads = self.loss, dict(self.state_updates), dict(self.grads)
        g.loss_value, g.tensor_grads, g.input_grads = self.loss_value, dict(self.tensor_grads), dict(self.input_grads)
        g.micro_batches, g._counts = self.micro_batches, dict(self._counts)
        return g

    def __repr__(self) -> str:
        return f"<Graph: {len(self.ops)} ops, {len(self.params)} params, inputs {self.inputs}>"

    def dump(self, deduced: Any = None, phases: Iterable[str] = PHASES) -> str:
        """FX-style text; with a deduction result, each tensor also shows its SBP and local shape."""
        from .printing import dump_graph

        return dump_graph(self, deduced, tuple(phases))
