"""Capture identical layers once: the joint graph of a deep stack of identical layers, built from a
capture of its first three.

torch.export and torch's autograd trace every layer of a 24-layer transformer one after the other,
although layers 1 to 22 make the same ATen nodes with other names (2.1 s of export and 2.9 s of
joint graph for GPT-2 24 x 1024). Here the model is captured with its layer list cut to three
layers (first, middle, last), and the middle layer's forward and backward nodes are copied for every
missing layer, renamed (module paths, parameter names, autograd sequence numbers) and wired to their
neighbours, so the result is node for node the graph a whole capture gives (tests compare them).

Only a stack that is checked to be periodic is repeated: a ``nn.ModuleList`` of at least
``MIN_LAYERS`` children of one class with the same parameter and buffer names, shapes and dtypes and
the same plain attributes (a layer index aside), whose captured layers make the same nodes in the
same order, each reading the same relative things (its own nodes, its neighbour layer's, its own
parameters, or one shared node). Anything else (a layer whose forward depends on its index, a
top-level op reading a middle layer, a constant made inside a layer) returns None and the caller
captures the whole model.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ...shortcut import Shortcut

MIN_LAYERS = 5  # below this a whole capture costs about as much as three layers and the checks
KEPT = 3  # layers captured: the first, one middle layer (the template), the last


REPEAT = Shortcut()


def whole_capture() -> contextlib.AbstractContextManager[None]:
    """Capture every layer inside this block (the reference the repeated route is measured against)."""
    return REPEAT.off()


def enabled() -> bool:
    return REPEAT.on


@dataclass(frozen=True)
class RepeatedLayers:
    """A list of identical layers: ``path`` of the ``nn.ModuleList`` in the model, ``n`` children."""

    path: str
    n: int


def find_layer_stack(model: nn.Module) -> RepeatedLayers | None:
    """The model's largest ``nn.ModuleList`` of identical layers (at least MIN_LAYERS), or None."""
    best: tuple[int, RepeatedLayers] | None = None
    for path, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) < MIN_LAYERS:
            continue
        first = _signature(mod[0])
        if first is None or any(_signature(c) != first for c in mod):
            continue
        size = sum(p.numel() for p in mod.parameters())
        if best is None or size > best[0]:
            best = (size, RepeatedLayers(path, len(mod)))
    return best[1] if best else None


_LAYER_INDEX_NAMES = ("layer_idx", "layer_id", "layer_number", "layer_index", "idx")


def _signature(layer: nn.Module) -> tuple | None:
    """What must be equal for two layers to trace the same: classes, tensors' shapes, plain attributes.

    A layer index may differ (the captured graphs of layers 1 and 2 are compared for whether it matters).
    None when an attribute cannot be compared."""
    sig: list[Any] = []
    for name, m in layer.named_modules():
        sig.append((name, type(m)))
        for k, p in m._parameters.items():
            sig.append((k, None) if p is None else (k, tuple(p.shape), p.dtype, p.requires_grad))
        for k, b in m._buffers.items():
            sig.append((k, None) if b is None else (k, tuple(b.shape), b.dtype))
        for k, v in vars(m).items():
            if k.startswith("_") or k in _LAYER_INDEX_NAMES or isinstance(v, (nn.Module, torch.Tensor)):
                continue
            if not isinstance(v, (int, float, str, bool, type(None), tuple, torch.dtype)):
                continue  # callables, configs: the graph comparison below still applies
            sig.append((k, v))
    try:
        hash(tuple(sig))
    except TypeError:
        return None
    return tuple(sig)


@contextlib.contextmanager
def cut_to(model: nn.Module, stack: RepeatedLayers, keep: int = KEPT) -> Iterator[None]:
    """The model with its layer list cut to its first ``keep`` layers, restored on exit."""
    parent_path, _, name = stack.path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    whole = parent._modules[name]
    parent._modules[name] = nn.ModuleList(list(whole)[:keep])
    try:
        yield
    finally:
        parent._modules[name] = whole


class CopiedNode:
    """A node of the whole stack's graph: what ``aten_capture._to_graph`` reads of an ``fx.Node`` (its kind,
    target, arguments and metadata), without an ``fx.Graph`` around it. The whole graph is read once, in
    order, and never traced or run, so the bookkeeping ``fx.Graph.node_copy`` does for each of its tens of
    thousands of nodes (unique names, user lists, argument checks) would be spent for nothing."""

    __slots__ = ("op", "target", "args", "kwargs", "meta", "name")

    def __init__(self, op: str, target: Any, args: tuple, kwargs: dict, meta: dict, name: str) -> None:
        self.op, self.target, self.args, self.kwargs, self.meta, self.name = op, target, args, kwargs, meta, name

    @property
    def stack_trace(self) -> str | None:
        return self.meta.get("stack_trace")

    def __repr__(self) -> str:
        return f"CopiedNode({self.name}: {self.op} {self.target})"


NODES = (fx.Node, CopiedNode)  # what a captured graph's arguments may reference


def _map_nodes(v: Any, f: Callable[[fx.Node], CopiedNode]) -> Any:
    """``v`` (a node's arguments) with each node replaced by ``f(node)``; lists stay lists, tuples tuples."""
    if isinstance(v, fx.Node):
        return f(v)
    if isinstance(v, tuple):
        return tuple([_map_nodes(x, f) for x in v])
    if isinstance(v, list):
        return [_map_nodes(x, f) for x in v]
    if isinstance(v, dict):
        return {k: _map_nodes(x, f) for k, x in v.items()}
    return v


class _Nodes:
    """The whole stack's graph as ``_to_graph`` walks it: ``nodes`` in order."""

    def __init__(self, nodes: list[CopiedNode]) -> None:
        self.nodes = nodes


class _Repeated:
    """What ``_to_graph`` reads of a GraphModule: its graph, and constants by name from the capture."""

    def __init__(self, graph: _Nodes, captured: fx.GraphModule):
        self.graph, self._captured = graph, captured

    def __getattr__(self, name: str) -> Any:
        return getattr(self._captured, name)


@dataclass
class _Layout:
    """Where the three captured layers sit in the joint graph's node list."""

    fwd: list[list[fx.Node]]  # forward nodes of layers 0, 1, 2 (equal lengths)
    bwd: list[list[fx.Node]]  # backward nodes of layers 1, 2 (equal lengths)
    params: list[list[fx.Node]]  # parameter and buffer placeholders of layers 0, 1, 2
    region: dict[fx.Node, tuple[str, int, int]]  # node -> ("F" or "B" or "P", layer, offset)
    period: int  # autograd sequence numbers between one layer and the next
    relative_seq: dict[fx.Node, bool]  # layer 1's nodes: is its number its layer's own (False: shared)


def repeat_layers(gm: fx.GraphModule, stack: RepeatedLayers) -> _Repeated | None:
    """The joint graph of the whole stack from ``gm``, the capture with the stack cut to KEPT layers;
    None when the captured layers are not periodic (the caller then captures the whole model)."""
    prefix = f"m.{stack.path}." if stack.path else "m."
    layout = _layout(gm, prefix)
    if layout is None or not _periodic(layout, prefix):
        return None
    return _Repeated(_build(gm, layout, prefix, stack.n), gm)


def _layer_of_path(path: str, prefix: str) -> int | None:
    if not path.startswith(prefix):
        return None
    head = path[len(prefix):].partition(".")[0]
    return int(head) if head.isdigit() else None


@lru_cache(maxsize=1 << 16)
def _rename(path: str, prefix: str, src: int, dst: int) -> str:
    """``path`` with layer ``src`` of the stack renamed ``dst`` (every copied node renames its module stack:
    the same few paths, tens of thousands of times on a 32-layer model)."""
    if src == dst or _layer_of_path(path, prefix) != src:
        return path
    head, dot, tail = path[len(prefix):].partition(".")
    return f"{prefix}{dst}{dot}{tail}"


def _stack(node: fx.Node) -> dict:
    return node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}


def _node_layer(node: fx.Node, prefix: str) -> int | None:
    stack = _stack(node)
    return _layer_of_path(list(stack.values())[-1][0], prefix) if stack else None


def _target_layer(desc: Any, prefix: str) -> int | None:
    target = getattr(desc, "target", None)
    return _layer_of_path(target, prefix) if isinstance(target, str) else None


def _layout(gm: fx.GraphModule, prefix: str) -> _Layout | None:
    nodes = list(gm.graph.nodes)
    params: list[list[int]] = [[], [], []]
    first: dict[tuple[str, int], int] = {}
    for i, n in enumerate(nodes):
        if n.op == "placeholder":
            layer = _target_layer(n.meta.get("desc"), prefix)
            if layer is not None:
                params[layer].append(i)
        elif n.op == "get_attr" and any(_node_layer(u, prefix) is not None for u in n.users):
            return None  # a constant made inside a layer: a whole capture names one per layer
        elif n.op == "call_function":
            layer = _node_layer(n, prefix)
            phase = "B" if n.meta.get("partitioner_tag") == "is_backward" else "F"
            if layer is not None:
                first.setdefault((phase, layer), i)
    if any(not p or p != list(range(p[0], p[0] + len(p))) for p in params) or len(set(map(len, params))) != 1:
        return None
    if not all((ph, k) in first for ph in "FB" for k in range(KEPT)):
        return None
    f0, f1, f2 = (first["F", k] for k in range(KEPT))
    b2, b1, b0 = (first["B", k] for k in (2, 1, 0))
    if not f0 < f1 < f2 < b2 < b1 < b0:
        return None
    span = f2 - f1
    fwd = [nodes[f0:f1], nodes[f1:f2], nodes[f2:f2 + span]]
    bwd = [nodes[b1:b0], nodes[b2:b1]]
    if len(fwd[0]) != span or len(bwd[0]) != len(bwd[1]) or f2 + span > b2:
        return None
    region: dict[fx.Node, tuple[str, int, int]] = {}
    for k, part in enumerate(fwd):
        region.update((n, ("F", k, j)) for j, n in enumerate(part))
    for k, part in ((1, bwd[0]), (2, bwd[1])):
        region.update((n, ("B", k, j)) for j, n in enumerate(part))
    for k, idx in enumerate(params):
        region.update((nodes[i], ("P", k, j)) for j, i in enumerate(idx))
    # every node of a layer lies in that layer's region (none outside, none of another layer inside)
    for i, n in enumerate(nodes):
        if n.op != "call_function":
            continue
        layer, where = _node_layer(n, prefix), region.get(n)
        if layer is not None and (where is None or where[1] != layer) and not (layer == 0 and i >= b0):
            return None
        if layer is None and where is None and i >= f1 and i < b0 and not (f2 + span <= i < b2):
            return None
    seqs = [[n.meta.get("seq_nr") for n in part] for part in fwd]
    deltas = {b - a for s, t in ((seqs[0], seqs[1]), (seqs[1], seqs[2])) for a, b in zip(s, t)
              if a is not None and b is not None}
    if len(deltas) != 1 or any((a is None) != (b is None) for a, b in zip(seqs[1], seqs[2])):
        return None
    period = deltas.pop()
    relative: dict[fx.Node, bool] = {}
    for a, b in (*zip(fwd[1], fwd[2]), *zip(bwd[0], bwd[1])):
        sa, sb = a.meta.get("seq_nr"), b.meta.get("seq_nr")
        if (sa is None) != (sb is None) or (sa is not None and sb - sa not in (0, period)):
            return None
        relative[a] = sa is None or sb - sa == period
    # a node that is no layer's may read a layer only where its position says which: the head reads
    # the last layer, what follows layer 0's backward reads layers 0 and 1
    for i, n in enumerate(nodes):
        if n.op == "output":
            if not _outputs_by_layer(n, region, prefix):
                return None
            continue
        if n in region or n.op != "call_function":
            continue
        read = {region[a][1] for a in n.all_input_nodes if a in region}
        if (f2 + span <= i < b2 and 1 in read) or (i >= b0 and 2 in read):
            return None
    return _Layout(fwd, bwd, [[nodes[i] for i in p] for p in params], region, period, relative)


def _outputs_by_layer(node: fx.Node, region: dict, prefix: str) -> bool:
    """Each layer's gradients (and buffer updates) are made inside that layer's nodes."""
    for v, desc in zip(node.args[0], node.meta.get("desc", ())):
        layer = _output_layer(desc, prefix)
        made = region[v][1] if isinstance(v, fx.Node) and v in region else None
        if layer in (1, 2) and made != layer or layer not in (1, 2) and made in (1, 2):
            return False
    return True


def _output_layer(desc: Any, prefix: str) -> int | None:
    inner = getattr(desc, "grad_of", None) or getattr(desc, "mutated_input", None)
    return _target_layer(inner, prefix) if inner is not None else None


def _token(v: Any, own: int, layout: _Layout) -> Any:
    """What an argument is, relative to the layer that reads it."""
    if isinstance(v, fx.Node):
        where = layout.region.get(v)
        if where is None:
            return ("shared", v)
        kind, layer, offset = where
        return (kind, layer - own, offset)
    if isinstance(v, (list, tuple)):
        return tuple(_token(x, own, layout) for x in v)
    if isinstance(v, dict):
        return tuple((k, _token(x, own, layout)) for k, x in v.items())
    return ("value", type(v), repr(v))


def _same(a: Any, b: Any, edge: str) -> bool:
    """Tokens equal; at the stack's edge a neighbour layer's node may stand where the edge layer reads
    a shared node (layer 0 reads the embeddings where layer 1 reads layer 0; the last layer reads the
    head's gradient where layer 1 reads layer 2's)."""
    if a == b:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and a and a[0] not in ("shared",
                                                                                                 "value"):
        if all(isinstance(x, tuple) for x in a) and all(isinstance(x, tuple) for x in b):
            return all(_same(x, y, edge) for x, y in zip(a, b))
    shared = a if isinstance(a, tuple) and a and a[0] == "shared" else None
    other = b if shared is not None else None
    if shared is None and isinstance(b, tuple) and b and b[0] == "shared":
        shared, other = b, a
    if shared is None or not isinstance(other, tuple) or len(other) != 3 or other[0] not in ("F", "B"):
        return False
    return (edge == "first" and other[1] == -1) or (edge == "last" and other[1] == 1)


def _periodic(layout: _Layout, prefix: str) -> bool:
    """The captured layers make the same nodes reading the same relative things (see the module doc)."""

    def stack_paths(n: fx.Node, layer: int) -> list[str]:
        return [_rename(p, prefix, layer, 1) for p, _ in _stack(n).values()]

    def match(a: list[fx.Node], la: int, b: list[fx.Node], lb: int, edge: str) -> bool:
        for x, y in zip(a, b):
            if x.target != y.target or x.meta.get("partitioner_tag") != y.meta.get("partitioner_tag"):
                return False
            if stack_paths(x, la) != stack_paths(y, lb):
                return False
            tx = (_token(x.args, la, layout), _token(x.kwargs, la, layout))
            ty = (_token(y.args, lb, layout), _token(y.kwargs, lb, layout))
            if not _same(tx, ty, edge):
                return False
        return True

    p = layout.params
    names = [[_rename(n.meta["desc"].target, prefix, k, 1) for n in p[k]] for k in range(KEPT)]
    if not (names[0] == names[1] == names[2]):
        return False
    f, b = layout.fwd, layout.bwd
    return (match(f[1], 1, f[2], 2, "none") and match(f[0], 0, f[1], 1, "first")
            and match(b[0], 1, b[1], 2, "last"))


def _rename_meta(meta: dict, prefix: str, src: int, dst: int, seq: Callable[[Any], Any]) -> dict:
    meta = dict(meta)
    for key in ("nn_module_stack", "fwd_nn_module_stack"):
        if meta.get(key):
            meta[key] = {k: (_rename(p, prefix, src, dst), t) for k, (p, t) in meta[key].items()}
    if meta.get("seq_nr") is not None:
        meta["seq_nr"] = seq(meta["seq_nr"])
    if "desc" in meta and not isinstance(meta["desc"], (list, tuple)):
        meta["desc"] = _rename_desc(meta["desc"], prefix, src, dst)
    return meta


def _rename_desc(desc: Any, prefix: str, src: int, dst: int) -> Any:
    if not dataclasses.is_dataclass(desc) or src == dst:
        return desc
    changes = {}
    for fld in dataclasses.fields(desc):
        v = getattr(desc, fld.name)
        if fld.name == "target" and isinstance(v, str):
            changes[fld.name] = _rename(v, prefix, src, dst)
        elif dataclasses.is_dataclass(v):
            changes[fld.name] = _rename_desc(v, prefix, src, dst)
    return dataclasses.replace(desc, **changes) if changes else desc


def _build(gm: fx.GraphModule, lay: _Layout, prefix: str, n_layers: int) -> _Nodes:
    """The whole stack's joint graph: layer 1 copied as layers 1..n-2, layer 2 renamed n-1."""
    last = n_layers - 1
    shift = (n_layers - KEPT) * lay.period  # autograd numbers after the middle layers move by this
    threshold = min(n.meta["seq_nr"] for n in lay.fwd[2] if n.meta.get("seq_nr") is not None)

    def global_seq(s: int) -> int:  # a number that is no layer's own: the loss's, the head's
        return s + shift if s >= threshold else s

    out: list[CopiedNode] = []
    env: dict[fx.Node, CopiedNode] = {}  # captured node -> its node in the whole graph (outside copies)
    copies: dict[int, dict[fx.Node, CopiedNode]] = {}  # layer i -> template node (layer 1's) -> copy

    def arg_map(i: int, own: int) -> Callable[[fx.Node], CopiedNode]:
        """Arguments of a node that stands for layer ``i`` of the whole graph and was captured in layer
        ``own``: a layer node read at relative layer d stands for layer i + d."""
        def f(v: fx.Node) -> CopiedNode:
            where = lay.region.get(v)
            if where is None:
                return env[v]
            kind, layer, offset = where
            j = i + layer - own
            if j <= 0 or j >= last:  # the first or last layer: emitted once, as captured
                return env[_at(lay, kind, 0 if j <= 0 else 2, offset)]
            return copies[j][_at(lay, kind, 1, offset)]
        return f

    def emit(node: fx.Node, i: int, own: int, seq: Callable[[int], int]) -> CopiedNode:
        f = arg_map(i, own)
        new = CopiedNode(node.op, node.target, _map_nodes(node.args, f), _map_nodes(node.kwargs, f),
                         _rename_meta(node.meta, prefix, own, i, seq), f"{node.name}.{i}")
        out.append(new)
        return new

    def copy_seq(node: fx.Node, i: int) -> Callable[[int], int]:
        rel = lay.relative_seq.get(node, True)
        return (lambda s: s + (i - 1) * lay.period) if rel else global_seq

    nodes = list(gm.graph.nodes)
    post = set(nodes[nodes.index(lay.fwd[2][-1]) + 1: nodes.index(lay.bwd[1][0])])
    templates = (lay.params[1], lay.fwd[1], lay.bwd[0])
    in_template = {n for part in templates for n in part}
    in_last = {n for part in (lay.params[2], lay.fwd[2], lay.bwd[1]) for n in part}
    for node in nodes:
        if node.op == "output":
            _emit_output(out, node, lay, prefix, last, env, copies)
        elif node in in_template:
            part = next(p for p in templates if node in p)
            if node is not part[0]:
                continue
            for i in (range(last - 1, 0, -1) if part is lay.bwd[0] else range(1, last)):
                m = copies.setdefault(i, {})
                for t in part:
                    m[t] = emit(t, i, 1, copy_seq(t, i))
        elif node in in_last or node in post:
            env[node] = emit(node, last, 2, global_seq)
        else:
            env[node] = emit(node, 0, 0, global_seq)
    return _Nodes(out)


def _at(lay: _Layout, kind: str, layer: int, offset: int) -> fx.Node:
    if kind == "P":
        return lay.params[layer][offset]
    if kind == "F":
        return lay.fwd[layer][offset]
    return lay.bwd[0 if layer == 1 else 1][offset]


def _emit_output(out: list[CopiedNode], node: fx.Node, lay: _Layout, prefix: str, last: int, env: dict,
                 copies: dict[int, dict[fx.Node, CopiedNode]]) -> None:
    values, descs = list(node.args[0]), list(node.meta.get("desc", ()))
    res_v: list[Any] = []
    res_d: list[Any] = []

    def layer_of(desc: Any) -> int | None:
        return _output_layer(desc, prefix)

    def value(v: Any, i: int | None) -> Any:
        if not isinstance(v, fx.Node):
            return v
        if i is not None and v in copies.get(i, {}):
            return copies[i][v]
        return env[v]

    k = 0
    while k < len(values):
        layer = layer_of(descs[k]) if k < len(descs) else None
        if layer == 1:
            end = k
            while end < len(values) and layer_of(descs[end]) == 1:
                end += 1
            for i in range(1, last):
                for v, d in zip(values[k:end], descs[k:end]):
                    res_v.append(value(v, i))
                    res_d.append(_rename_desc(d, prefix, 1, i))
            k = end
            continue
        if layer == 2:
            res_v.append(value(values[k], None))
            res_d.append(_rename_desc(descs[k], prefix, 2, last))
        else:
            res_v.append(value(values[k], None))
            res_d.append(descs[k])
        k += 1
    out.append(CopiedNode("output", "output", (tuple(res_v) if isinstance(node.args[0], tuple) else res_v,), {},
                          {**node.meta, "desc": res_d}, node.name))
