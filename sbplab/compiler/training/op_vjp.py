"""torch's own backward of one registry op, traced once and spliced into a graph as ATen ops.

A forward op of the fx path or of a hand-built graph (``linear``, ``layer_norm``, ``cross_entropy``...)
keeps its name, module and hints; its backward is what torch's autograd does for the op's local kernel.
``make_fx`` traces ``torch.autograd.grad`` of ``OpDef.kernel`` on fake tensors, with the decompositions
the ATen capture applies (``ops/aten/decompositions.py``, so the same family rules hold), and the trace
becomes a ``Recipe``: the backward's ATen calls with each tensor named by where it comes from (an input
of the forward op, one of its outputs, an output's gradient, or an earlier call). Splicing a recipe adds
those calls to the graph as registry ops named after their overloads, exactly as a captured graph
holds them, so deduction, lowering and the workers treat them alike.

Where the backward reads a tensor the forward op outputs (relu's output, softmax's probabilities) it
reads the op's output. A forward intermediate that the op does not output (layer norm's mean and
rstd, the log-softmax inside a cross entropy, a linear's 2-D view of its input) is recomputed inside
the backward from the op's inputs: ``Recipe.recomputed`` counts those calls, and their FLOPs join the
backward's (a layer norm's or a cross entropy's backward costs one more forward of the op; a view
costs nothing).

Recipes are cached per (op type, attrs, input shapes and dtypes, which inputs need a gradient, which
outputs bring one): the layers of a model repeat, so a GPT traces each kind of op once.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.fx as fx

from ...freeze import freeze_attrs
from ...ops.aten.calls import DeviceSlot, Slot, op_name, passed_through
from ...ops.registry import TensorMeta, get_op
from ..ir import Graph, GraphError, OpNode

# where a tensor of the backward comes from: ("in", i), ("out", i), ("gout", i) of the forward op, or
# ("call", s, k): output k of the recipe's call s (k None for a call with one output)
Ref = tuple


@dataclass(frozen=True)
class Call:
    """One ATen call of the backward: the overload's name, what it reads, its argument template."""

    name: str
    reads: tuple[Ref, ...]
    attrs: tuple  # frozen {"args": ..., "kwargs": ...} with Slot(k) for reads[k]
    multi: bool  # returns a tuple (native_layer_norm_backward) rather than one tensor
    recompute: bool  # reads no output gradient: a forward intermediate made again


@dataclass(frozen=True)
class Recipe:
    """The backward of one op instance: its calls in order and the gradient of each input (None where
    the input needs none or the op does not depend on it)."""

    calls: tuple[Call, ...]
    grads: tuple[Ref | None, ...]

    @property
    def recomputed(self) -> int:
        """Calls that remake a forward intermediate from the op's inputs."""
        return sum(c.recompute for c in self.calls)


def _fake(metas: Sequence[TensorMeta]) -> list[torch.Tensor]:
    return [torch.empty(m.shape, dtype=m.dtype) for m in metas]


@lru_cache(maxsize=4096)
def recipe(type: str, in_metas: tuple[TensorMeta, ...], frozen: tuple, needs: tuple[bool, ...],
           has_gout: tuple[bool, ...]) -> Recipe:
    """The traced backward of op ``type`` on inputs ``in_metas`` with attrs ``dict(frozen)``; ``needs``:
    which inputs want a gradient, ``has_gout``: which outputs bring one."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from ...ops.aten.decompositions import decompositions

    op = get_op(type)
    attrs = dict(frozen)
    out_metas = op.infer(list(in_metas), attrs)
    n_in = len(in_metas)
    unused: list[int] = []  # inputs autograd found no path to (set while tracing)

    def step(*flat: torch.Tensor):
        ins = [x.requires_grad_(True) if n else x for x, n in zip(flat[:n_in], needs)]
        ys = tuple(op.kernel(ins, attrs))
        pairs = [(y, g) for y, g, h in zip(ys, flat[n_in:], has_gout) if h and y.requires_grad]
        wanted = [x for x, n in zip(ins, needs) if n]
        gs = torch.autograd.grad([y for y, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True) \
            if pairs else [None] * len(wanted)
        unused[:] = [k for k, g in enumerate(gs) if g is None]
        return (*ys, *[g for g in gs if g is not None])

    with FakeTensorMode():
        flat = [*_fake(in_metas), *_fake(out_metas)]
    try:
        gm = make_fx(step, decomposition_table=decompositions(), tracing_mode="fake")(*flat)
    except Exception as e:  # noqa: BLE001  (torch's tracing error, named with the op)
        raise GraphError(f"torch's autograd could not differentiate op {type!r} on inputs "
                         f"{[tuple(m.shape) for m in in_metas]} with {attrs}: {_type_name(e)}: {e}") from e
    return _to_recipe(gm, n_in, len(out_metas), needs, unused)


def _type_name(e: BaseException) -> str:
    return type(e).__name__


def _cancel_transposes(gm: fx.GraphModule) -> None:
    """``t(t(x))`` is ``x``: a linear's backward transposes its weight's transpose."""
    t = torch.ops.aten.t.default
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is t:
            inner = node.args[0]
            if isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target is t:
                node.replace_all_uses_with(inner.args[0])
    gm.graph.eliminate_dead_code()


def _drop_noop_reshapes(gm: fx.GraphModule) -> None:
    """An ``expand`` or ``view`` to the shape its input has already is its input (a 4-D matmul's backward
    expands each operand to its own shape)."""
    same = (torch.ops.aten.expand.default, torch.ops.aten.view.default)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in same and isinstance(node.args[0], fx.Node):
            src, val = node.args[0].meta.get("val"), node.meta.get("val")
            if isinstance(src, torch.Tensor) and isinstance(val, torch.Tensor) and src.shape == val.shape:
                node.replace_all_uses_with(node.args[0])
    gm.graph.eliminate_dead_code()


def _squeeze_sums(gm: fx.GraphModule) -> None:
    """``view(sum(x, dims, keepdim=True), shape)`` dropping exactly the kept dims is ``sum(x, dims)``: a
    bias's gradient, then made by one op that can write it straight into its bucket (``ops/aten/into.py``)."""
    total, view = torch.ops.aten.sum.dim_IntList, torch.ops.aten.view.default
    for node in list(gm.graph.nodes):
        src = node.args[0] if node.op == "call_function" and node.target is view else None
        if not (isinstance(src, fx.Node) and src.op == "call_function" and src.target is total
                and len(src.users) == 1 and len(src.args) == 3 and src.args[2] is True and not src.kwargs):
            continue
        x, dims = src.args[0], src.args[1]
        ndim = len(x.meta["val"].shape)
        dropped = {d % ndim for d in dims} if dims else set(range(ndim))
        kept = [n for i, n in enumerate(src.meta["val"].shape) if i not in dropped]
        if list(node.args[1]) == kept:
            src.args = (x, dims, False)
            src.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(src)
    gm.graph.eliminate_dead_code()


def _to_recipe(gm: fx.GraphModule, n_in: int, n_out: int, needs: tuple[bool, ...], unused: list[int]) -> Recipe:
    _cancel_transposes(gm)
    _drop_noop_reshapes(gm)
    _squeeze_sums(gm)
    nodes = list(gm.graph.nodes)
    places = [n for n in nodes if n.op == "placeholder"]
    out_node = next(n for n in nodes if n.op == "output")
    results = list(out_node.args[0])
    env: dict[fx.Node, Any] = {}
    for k, p in enumerate(places):
        env[p] = ("in", k) if k < n_in else ("gout", k - n_in)
    for k, y in enumerate(results[:n_out]):
        if isinstance(y, fx.Node) and y.op != "placeholder":
            env[y] = ("out", k)
    grad_nodes = results[n_out:]
    gout_nodes = set(places[n_in:])
    # the calls the gradients need, found backwards from them; the forward's own outputs are read, not remade
    need: set[fx.Node] = set()
    todo = [g for g in grad_nodes if isinstance(g, fx.Node)]
    while todo:
        n = todo.pop()
        if n in need or n in env:
            continue
        need.add(n)
        todo.extend(a for a in n.all_input_nodes)
    reads_gout: set[fx.Node] = set()
    calls: list[Call] = []
    for n in nodes:
        if n not in need or n.op != "call_function":
            continue
        if any(a in gout_nodes or a in reads_gout for a in n.all_input_nodes):
            reads_gout.add(n)
        if n.target is operator.getitem:
            src, k = n.args
            env[n] = (*env[src][:2], k)
            continue
        name = op_name(n.target)
        if passed_through(name, n, env):
            continue
        if n.target._schema.is_mutable:  # a graph is functional: a worker would write into another op's tensor
            raise GraphError(f"the backward torch traced calls {name}, which writes into its input; ops of a "
                             f"graph are functional, so this op's kernel needs an out-of-place form")
        reads: list[Ref] = []
        attrs = {"args": _template(tuple(n.args), env, reads),
                 "kwargs": tuple((k, _template(v, env, reads)) for k, v in n.kwargs.items())}
        multi = isinstance(n.meta.get("val"), (tuple, list))
        env[n] = ("call", len(calls), None)
        calls.append(Call(name, tuple(reads), freeze_attrs(attrs), multi, n not in reads_gout))
    grads: list[Ref | None] = []
    it = iter(grad_nodes)
    wanted = 0
    for needed in needs:
        if not needed:
            grads.append(None)
            continue
        if wanted in unused:
            grads.append(None)
        else:
            g = next(it)
            grads.append(env[g] if isinstance(g, fx.Node) else None)
        wanted += 1
    return Recipe(tuple(calls), tuple(grads))


def _template(v: Any, env: dict, reads: list[Ref]) -> Any:
    if isinstance(v, fx.Node):
        ref = env[v]
        if ref is None:
            return None
        reads.append(ref)
        return Slot(len(reads) - 1)
    if isinstance(v, (list, tuple)):
        return tuple(_template(x, env, reads) for x in v)
    if isinstance(v, torch.device):
        return DeviceSlot()
    return v


def splice(graph: Graph, op: OpNode, rec: Recipe, gouts: Sequence[str | None]) -> list[str | None]:
    """Add ``rec``'s calls to ``graph`` as the backward of ``op`` (phase "backward", ``forward_op`` the op,
    its module and source); returns the gradient tensor of each of ``op``'s inputs (None: none)."""
    made: list[list[str]] = []

    def name_of(ref: Ref) -> str:
        kind = ref[0]
        if kind == "in":
            return op.inputs[ref[1]]
        if kind == "out":
            return op.outputs[ref[1]]
        if kind == "gout":
            g = gouts[ref[1]]
            if g is None:
                raise GraphError(f"the backward of {op.name!r} reads the gradient of output {ref[1]}, which has none")
            return g
        outs = made[ref[1]]
        return outs[0] if ref[2] is None else outs[ref[2]]

    for c in rec.calls:
        base = c.name.split(".")[1]
        node = graph.add_op(c.name, [name_of(r) for r in c.reads], dict(c.attrs), phase="backward",
                            name=f"{op.module}.{base}" if op.module else base, module=op.module,
                            source=op.source, forward_op=op.name)
        made.append(list(node.outputs))
    return [None if r is None else name_of(r) for r in rec.grads]


def backward_of(graph: Graph, op: OpNode, needs: Sequence[bool], gouts: Sequence[str | None]) -> list[str | None]:
    """torch's backward of forward op ``op`` added to ``graph``: one gradient per input (None where
    ``needs`` says none is wanted, or the op does not depend on the input)."""
    metas = tuple(graph.tensors[i].meta for i in op.inputs)
    rec = recipe(op.type, metas, freeze_attrs(op.attrs), tuple(bool(n) for n in needs),
                 tuple(g is not None for g in gouts))
    return splice(graph, op, rec, gouts)
