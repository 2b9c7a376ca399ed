"""``from_torch``: a torch.nn.Module and example inputs become a logical graph of registry ops.

The module is traced with torch.fx (see ``fx_trace``: shapes are concrete), then each fx node is
mapped: leaf modules (nn.Linear, nn.LayerNorm, ...) and functions (F.*, torch.*, operators,
tensor methods) through the tables in ``fx_handlers``; work on constants alone is evaluated on the
spot. Everything that cannot be mapped is collected, and one error lists all of it with the
source line of each, so a user fixes a model in one pass instead of one error at a time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ...errors import SbplabError
from ...gc_pause import without_gc
from ..ir import Graph, GraphError
from .fx_trace import ShapeTracer, source_of


@dataclass(frozen=True)
class TRef:
    """A graph tensor inside the converter (everything else in the environment is a Python value)."""

    name: str


class _Bad:
    """The result of something unsupported: nodes that read it are skipped, not reported again."""


BAD = _Bad()


class UnsupportedError(SbplabError):
    """Raised by a handler: this call cannot be mapped; the message says why and what would work."""


class UnsupportedModelError(GraphError):
    """Every unsupported module, function or method of a model, each with its source line."""

    def __init__(self, problems: list[tuple[str, str, str]]) -> None:
        self.problems = problems
        lines = [f"  - {what}: {why}" + (f"\n      at {src}" if src else "") for what, why, src in problems]
        super().__init__(f"the model uses {len(problems)} thing(s) sbplab cannot compile:\n" + "\n".join(lines))


class Converter:
    """Walks an fx graph and appends registry ops to a logical ``Graph``."""

    def __init__(self, graph: Graph, root: nn.Module, prefix: str = "") -> None:
        self.graph, self.root, self.prefix = graph, root, prefix
        self.problems: list[tuple[str, str, str]] = []
        self.params: dict[int, str] = {}  # id(Parameter) -> graph name (tied weights share one)
        self.copies: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}  # id -> (tensor, version, copy)
        self.node: fx.Node | None = None
        self.module = ""

    # --- helpers for handlers -----------------------------------------------------------------
    def op(self, type: str, inputs: list, attrs: dict | None = None, name: str | None = None) -> TRef:
        ins = [self.tensor(x).name for x in inputs]
        n = self.node
        node = self.graph.add_op(type, ins, attrs, name=name or (n.name if n is not None else type),
                                 module=self.module, source=source_of(n) if n is not None else "")
        return TRef(node.outputs[0])

    def tensor(self, v: Any) -> TRef:
        """A graph tensor for ``v``: graph tensors pass, torch constants become ``const`` tensors."""
        if isinstance(v, TRef):
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = torch.tensor(float(v))
        if isinstance(v, torch.Tensor):
            name = self.graph.fresh_name("const")
            self.graph.add_tensor(name, tuple(v.shape), "const", v.dtype, value=self.copy(v), module=self.module)
            return TRef(name)
        raise UnsupportedError(f"expected a tensor, got {type(v).__name__} {v!r}")

    def copy(self, v: torch.Tensor) -> torch.Tensor:
        """A detached copy of a constant; one tensor read by many ops (a causal mask every layer
        adds) is copied once while it is unchanged, and its consts share that copy."""
        got = self.copies.get(id(v))
        if got is not None and got[0] is v and got[1] == v._version:
            return got[2]
        c = v.detach().clone()
        self.copies[id(v)] = (v, v._version, c)
        return c

    def shape(self, v: Any) -> tuple[int, ...]:
        if isinstance(v, TRef):
            return self.graph.tensors[v.name].shape
        return tuple(v.shape)

    def dtype(self, v: Any) -> torch.dtype:
        return self.graph.tensors[v.name].meta.dtype if isinstance(v, TRef) else v.dtype

    def param(self, p: torch.Tensor, name: str) -> TRef:
        """A module parameter as a graph ``param`` (``requires_grad=False`` ones are constants)."""
        if id(p) in self.params:
            return TRef(self.params[id(p)])
        if not isinstance(p, nn.Parameter) or not p.requires_grad:
            return self.tensor(p)
        name = self.prefix + name
        self.graph.add_tensor(name, tuple(p.shape), "param", p.dtype, value=p.detach().clone(),
                              module=name.rsplit(".", 1)[0] if "." in name else "")
        self.params[id(p)] = name
        return TRef(name)

    # --- the walk -----------------------------------------------------------------------------
    def run(self, fxg: fx.Graph, env: dict[str, Any]) -> Any:
        from .fx_tables import handle, has_mapping

        vals: dict[fx.Node, Any] = {}
        for node in fxg.nodes:
            self.node = node
            self.module = _module_of(node, self.prefix)
            if node.op == "placeholder":
                vals[node] = env[node.name] if node.name in env else env[node.target]
                continue
            if node.op == "output":
                return _resolve(node.args[0], vals)
            if node.op == "get_attr":
                obj = self.root
                for atom in node.target.split("."):
                    obj = getattr(obj, atom)
                vals[node] = self.param(obj, node.target) if isinstance(obj, nn.Parameter) else obj
                continue
            args, kwargs = _resolve(node.args, vals), _resolve(node.kwargs, vals)
            if _contains(args, kwargs, lambda v: v is BAD):
                if not has_mapping(self, node):  # report it too: one error lists everything
                    self.problems.append((_describe(node, self.root), "no mapping to sbplab ops", source_of(node)))
                vals[node] = BAD
                continue
            try:
                vals[node] = handle(self, node, args, kwargs)
            except UnsupportedError as e:
                self.problems.append((_describe(node, self.root), str(e), source_of(node)))
                vals[node] = BAD
        return None


def _resolve(a: Any, vals: dict) -> Any:
    return fx.node.map_aggregate(a, lambda x: vals[x] if isinstance(x, fx.Node) else x)


def _contains(args: Any, kwargs: Any, pred: Callable[[Any], bool]) -> bool:
    found = False

    def visit(x):
        nonlocal found
        found = found or pred(x)
        return x
    fx.node.map_aggregate((args, kwargs), visit)
    return found


def has_tensor(args: Any, kwargs: Any) -> bool:
    return _contains(args, kwargs, lambda v: isinstance(v, TRef))


def _module_of(node: fx.Node, prefix: str) -> str:
    if node.op == "call_module":
        return prefix + str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return prefix.rstrip(".")
    path = list(stack.values())[-1][0]
    return prefix + path


def _describe(node: fx.Node, root: nn.Module) -> str:
    if node.op == "call_module":
        mod = root.get_submodule(node.target)
        return f"module {type(mod).__module__}.{type(mod).__name__} ({node.target})"
    if node.op == "call_method":
        return f"tensor method .{node.target}()"
    t = node.target
    mod = (getattr(t, "__module__", None) or "").replace("_operator", "operator")
    return f"function {mod + '.' if mod else ''}{getattr(t, '__name__', str(t))}"


class _LossModule(nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, pred, target):
        return self.fn(pred, target)


def _input_names(module: nn.Module, n: int) -> tuple[list[str], dict[str, Any]]:
    """Names of the first ``n`` forward arguments, and defaults for the rest (traced as constants)."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) < n:
        raise GraphError(f"{type(module).__name__}.forward takes {len(params)} positional inputs, "
                         f"but {n} example inputs were given")
    missing = [p.name for p in params[n:] if p.default is inspect.Parameter.empty]
    if missing:
        raise GraphError(f"{type(module).__name__}.forward needs inputs {missing} that were not given")
    return [p.name for p in params[:n]], {p.name: p.default for p in params[n:]}


@without_gc
def from_torch(module: nn.Module, example_inputs: Any, loss_fn: Callable | None = None,
               target: torch.Tensor | None = None) -> Graph:
    """Trace ``module`` on ``example_inputs`` (a tensor or a tuple) into a logical graph.

    With ``loss_fn`` (``F.cross_entropy``, ``nn.MSELoss()``, any traceable callable) and a
    ``target`` example, the graph ends in that scalar loss and takes ``target`` as an extra input;
    a module that itself returns a scalar is taken as returning its loss. Shapes are baked in from
    the examples (the batch size too: micro-batching traces with the micro-batch's shape).
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise GraphError("example_inputs must be tensors (or a tuple of tensors)")
    names, defaults = _input_names(module, len(example_inputs))
    graph = Graph()
    env = {}
    for n, t in zip(names, example_inputs):
        graph.add_tensor(n, tuple(t.shape), "input", t.dtype)
        env[n] = TRef(n)
    tracer_inputs = dict(zip(names, example_inputs))
    tracer = ShapeTracer(tracer_inputs)
    fxg = tracer.trace(module, concrete_args=defaults or None)
    conv = Converter(graph, tracer.root)
    out = conv.run(fxg, env)
    problems = list(conv.problems)
    if loss_fn is not None:
        if target is None:
            raise GraphError("from_torch(loss_fn=...) needs a target example tensor")
        if not isinstance(out, TRef):
            if not problems:
                raise GraphError(f"the model must return one tensor to apply loss_fn, got {type(out).__name__}")
        else:
            graph.outputs = [out.name]
            graph.add_tensor("target", tuple(target.shape), "input", target.dtype)
            lm = _LossModule(loss_fn)
            pred = torch.empty(graph.tensors[out.name].shape, dtype=graph.tensors[out.name].meta.dtype)
            ltracer = ShapeTracer({"pred": pred, "target": target})
            lfx = ltracer.trace(lm)
            lconv = Converter(graph, ltracer.root)
            lconv.params = conv.params
            out = lconv.run(lfx, {"pred": out, "target": TRef("target")})
            problems += lconv.problems
    if problems:
        raise UnsupportedModelError(problems)
    if isinstance(out, (tuple, list)) and all(isinstance(o, TRef) for o in out):
        graph.outputs = [o.name for o in out]
    elif isinstance(out, TRef):
        if loss_fn is None:
            graph.outputs = [out.name]
        if graph.tensors[out.name].shape == ():
            graph.loss = out.name
    else:
        raise GraphError(f"the model returned {type(out).__name__}; it must return a tensor (or a tuple of tensors)")
    graph.validate()
    return graph
