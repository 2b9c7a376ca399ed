"""GraphBuilder: write a logical graph by hand, one registry op per line, to see what each op does.

    b = sl.GraphBuilder()
    x = b.input("x", (8, 16))
    w = b.param("w", (32, 16))
    h = b.relu(b.linear(x, w))              # any registry op is a method: b.<op>(*inputs, **attrs)
    loss = b.cross_entropy(h, b.input("t", (8,), torch.int64))
    graph = b.build(loss)                   # then sl.compile_graph(graph, sl.SGD(), strategy)

Values support ``@ + - * /`` and unary minus, and call ops as methods (``h.softmax(dim=-1)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...ops.registry import REGISTRY
from ..ir import Graph, GraphError


class Value:
    """A tensor of the graph being built."""

    def __init__(self, builder: GraphBuilder, name: str) -> None:
        self.b, self.name = builder, name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.b.graph.tensors[self.name].shape

    @property
    def dtype(self) -> torch.dtype:
        return self.b.graph.tensors[self.name].meta.dtype

    def __repr__(self) -> str:
        return f"Value({self.name}: {list(self.shape)})"

    def _arith(self, other: Any, op: str, reverse: bool = False) -> Value:
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            if op == "mul":
                return self.b.op("scale", self, factor=float(other))
            if op == "div" and not reverse:
                return self.b.op("scale", self, factor=1.0 / float(other))
            if op == "add":
                return self.b.op("add_scalar", self, value=float(other))
            if op == "sub":
                neg = self.b.op("neg", self) if reverse else self
                return self.b.op("add_scalar", neg, value=float(other) if reverse else -float(other))
            raise GraphError("a number divided by a tensor has no op; multiply by a reciprocal instead")
        a, c = (other, self) if reverse else (self, other)
        return self.b.op(op, a, c)

    def __matmul__(self, other: Value) -> Value:
        return self.b.op("matmul", self, other)

    def __add__(self, o):
        return self._arith(o, "add")

    def __radd__(self, o):
        return self._arith(o, "add", True)

    def __sub__(self, o):
        return self._arith(o, "sub")

    def __rsub__(self, o):
        return self._arith(o, "sub", True)

    def __mul__(self, o):
        return self._arith(o, "mul")

    def __rmul__(self, o):
        return self._arith(o, "mul", True)

    def __truediv__(self, o):
        return self._arith(o, "div")

    def __neg__(self) -> Value:
        return self.b.op("neg", self)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in REGISTRY:
            raise AttributeError(f"Value has no attribute {name!r}; registry ops are {sorted(REGISTRY)}")
        return lambda *more, **attrs: self.b.op(name, self, *more, **attrs)


class GraphBuilder:
    """Builds a forward ``Graph``; parameters get random initial values from a seeded generator."""

    def __init__(self, seed: int = 0) -> None:
        self.graph = Graph()
        self.gen = torch.Generator().manual_seed(seed)

    def input(self, name: str, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Value:
        self.graph.add_tensor(name, shape, "input", dtype)
        return Value(self, name)

    def param(self, name: str, shape: Sequence[int], init: torch.Tensor | str = "randn", scale: float = 0.1) -> Value:
        """A trainable tensor: ``init`` is a tensor, or "randn" (times ``scale``), "zeros", "ones"."""
        if isinstance(init, torch.Tensor):
            value = init.detach().clone().float()
        elif init == "randn":
            value = torch.randn(tuple(shape), generator=self.gen) * scale
        elif init in ("zeros", "ones"):
            value = (torch.zeros if init == "zeros" else torch.ones)(tuple(shape))
        else:
            raise GraphError(f"param {name!r}: init must be a tensor, 'randn', 'zeros' or 'ones', got {init!r}")
        self.graph.add_tensor(name, shape, "param", value.dtype, value=value, module=name.rpartition(".")[0])
        return Value(self, name)

    def const(self, name: str, value: torch.Tensor) -> Value:
        self.graph.add_tensor(name, tuple(value.shape), "const", value.dtype, value=value.detach().clone())
        return Value(self, name)

    def op(self, type: str, *inputs: Value, name: str | None = None, **attrs) -> Value | tuple[Value, ...]:
        for v in inputs:
            if not isinstance(v, Value) or v.b is not self:
                raise GraphError(f"op {type!r}: inputs must be Values of this builder, got {v!r}")
        node = self.graph.add_op(type, [v.name for v in inputs], attrs, name=name)
        outs = tuple(Value(self, o) for o in node.outputs)
        return outs[0] if len(outs) == 1 else outs

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in REGISTRY:
            raise AttributeError(f"GraphBuilder has no attribute {name!r}; registry ops are {sorted(REGISTRY)}")
        return lambda *inputs, **attrs: self.op(name, *inputs, **attrs)

    def build(self, loss: Value | None = None, outputs: Sequence[Value] = ()) -> Graph:
        """The graph; ``loss`` (a scalar) makes it trainable."""
        g = self.graph
        if loss is not None:
            if loss.shape != ():
                raise GraphError(f"the loss must be a scalar, {loss.name!r} has shape {loss.shape}")
            g.loss = loss.name
        g.outputs = [v.name for v in outputs] or ([loss.name] if loss is not None else [])
        g.validate()
        return g
