"""Capture identical layers from two: the joint graph of a deep stack built from a capture of its first
two layers, a layer fewer to trace than ``layer_repeat``'s three (a third less of torch's tracing).

A middle layer reads its predecessor where the first layer reads the embeddings, and its successor's
gradient where the last layer reads the head's. With the stack cut to two layers, layer 1 is the last
and layer 0 the first, so neither is a middle layer; but each shows one side of it: layer 1 reads its
predecessor as a middle layer does, and layer 0 reads its successor's gradient as a middle layer does.
The middle layer is layer 1 with, at each argument where layer 1 reads a shared node (the head's
gradient) and layer 0 reads a node of the layer after it, that node of the layer after. Every other
argument must agree between the two layers, relative to each (its own nodes, its parameters, the layer
before, or one shared node); anything else returns None and the caller captures three layers
(``layer_repeat``), then every layer. The result is, node for node, the graph a whole capture gives
(tests compare them on transformers' GPT-2 and Llama and the zoo GPT).

Layer 1's nodes then serve twice: as the template of layers 1 to n-2 (with the middle arguments) and
as layer n-1 itself (with the arguments it was captured with).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from ...shortcut import Shortcut
from .layer_copy import COPY_OPS, CopiedLayer
from .layer_repeat import (
    CopiedNode,
    RepeatedLayers,
    _map_nodes,
    _node_layer,
    _Nodes,
    _output_layer,
    _rename,
    _rename_desc,
    _rename_meta,
    _Repeated,
    _stack,
    _target_layer,
    _token,
)

KEPT = 2  # layers captured: the first and the last

PAIR_ROUTE = Shortcut()


def three_layer_capture() -> contextlib.AbstractContextManager[None]:
    """Inside this block a stack is captured from three layers (``layer_repeat``), not two."""
    return PAIR_ROUTE.off()


def enabled() -> bool:
    return PAIR_ROUTE.on


@dataclass(frozen=True)
class _Ref:
    """A node relative to the layer that reads it: ``kind`` "F", "B" or "P", ``rel`` layers away, at
    ``offset`` in that layer's part."""

    kind: str
    rel: int
    offset: int


@dataclass
class _Pair:
    """Where the two captured layers sit in the joint graph's node list."""

    fwd: list[list[fx.Node]]  # forward nodes of layers 0 and 1 (equal lengths)
    bwd: list[list[fx.Node]]  # backward nodes of layers 0 and 1 (equal lengths)
    params: list[list[fx.Node]]  # parameter and buffer placeholders of layers 0 and 1
    region: dict[fx.Node, tuple[str, int, int]]  # node -> ("F" or "B" or "P", layer, offset)
    period: int  # autograd sequence numbers between one layer and the next
    relative_seq: dict[fx.Node, bool]  # layer 1's nodes: is its number its layer's own (False: shared)
    head: set[fx.Node]  # nodes between layer 1's forward and its backward (the head, the loss)


class _NotPeriodic(Exception):
    pass


def repeat_pair(gm: fx.GraphModule, stack: RepeatedLayers) -> _Repeated | None:
    """The joint graph of the whole stack from ``gm``, the capture with the stack cut to two layers;
    None when the two layers do not show a middle layer (the caller then captures three)."""
    prefix = f"m.{stack.path}." if stack.path else "m."
    pair = _pair(gm, prefix)
    if pair is None:
        return None
    try:
        middle = _middle(pair, prefix)
    except _NotPeriodic:
        return None
    return _Repeated(_build(gm, pair, middle, prefix, stack.n), gm)


def _pair(gm: fx.GraphModule, prefix: str) -> _Pair | None:
    nodes = list(gm.graph.nodes)
    params: list[list[int]] = [[], []]
    first: dict[tuple[str, int], int] = {}
    for i, n in enumerate(nodes):
        if n.op == "placeholder":
            layer = _target_layer(n.meta.get("desc"), prefix)
            if layer is not None:
                if layer >= KEPT:
                    return None
                params[layer].append(i)
        elif n.op == "get_attr" and any(_node_layer(u, prefix) is not None for u in n.users):
            return None  # a constant made inside a layer: a whole capture names one per layer
        elif n.op == "call_function":
            layer = _node_layer(n, prefix)
            if layer is not None:
                if layer >= KEPT:
                    return None
                first.setdefault(("B" if n.meta.get("partitioner_tag") == "is_backward" else "F", layer), i)
    if any(not p or p != list(range(p[0], p[0] + len(p))) for p in params) or len(params[0]) != len(params[1]):
        return None
    if not all((ph, k) in first for ph in "FB" for k in range(KEPT)):
        return None
    f0, f1, b1, b0 = first["F", 0], first["F", 1], first["B", 1], first["B", 0]
    span, bspan = f1 - f0, b0 - b1
    if not (f0 < f1 and f1 + span <= b1 < b0 and b0 + bspan <= len(nodes)):
        return None
    fwd = [nodes[f0:f1], nodes[f1:f1 + span]]
    bwd = [nodes[b0:b0 + bspan], nodes[b1:b0]]
    region: dict[fx.Node, tuple[str, int, int]] = {}
    for k in range(KEPT):
        region.update((n, ("F", k, j)) for j, n in enumerate(fwd[k]))
        region.update((n, ("B", k, j)) for j, n in enumerate(bwd[k]))
        region.update((nodes[i], ("P", k, j)) for j, i in enumerate(params[k]))
    head = set(nodes[f1 + span:b1])
    for i, n in enumerate(nodes):
        if n.op == "output":
            if not _outputs_by_layer(n, region, prefix):
                return None
            continue
        if n.op != "call_function":
            continue
        layer, where = _node_layer(n, prefix), region.get(n)
        if layer is not None and (where is None or where[1] != layer):
            return None  # a layer's node outside its layer's parts
        if where is None:  # the head reads only the last layer, what follows layer 0's backward only layer 0
            read = {region[a][1] for a in n.all_input_nodes if a in region}
            if (n in head and 0 in read) or (i >= b0 + bspan and 1 in read) or (i < f0 and read):
                return None
    seqs = [[n.meta.get("seq_nr") for n in part] for part in fwd]
    deltas = {b - a for a, b in zip(*seqs) if a is not None and b is not None}
    if len(deltas) != 1 or any((a is None) != (b is None) for a, b in zip(*seqs)):
        return None
    period = deltas.pop()
    relative: dict[fx.Node, bool] = {}
    for a, b in (*zip(fwd[0], fwd[1]), *zip(bwd[0], bwd[1])):
        sa, sb = a.meta.get("seq_nr"), b.meta.get("seq_nr")
        if (sa is None) != (sb is None) or (sa is not None and sb - sa not in (0, period)):
            return None
        relative[b] = sa is None or sb - sa == period
    return _Pair(fwd, bwd, [[nodes[i] for i in p] for p in params], region, period, relative, head)


def _outputs_by_layer(node: fx.Node, region: dict, prefix: str) -> bool:
    """Layer 1's gradients (and buffer updates) are made inside its nodes, and nothing else is."""
    for v, desc in zip(node.args[0], node.meta.get("desc", ())):
        made = region[v][1] if isinstance(v, fx.Node) and v in region else None
        if (_output_layer(desc, prefix) == 1) != (made == 1):
            return False
    return True


def _middle(pair: _Pair, prefix: str) -> dict[fx.Node, tuple[Any, Any]]:
    """Layer 1's nodes -> the (args, kwargs) a middle layer's copy reads, as ``_Ref``s and shared nodes."""
    names = [[_rename(n.meta["desc"].target, prefix, k, 1) for n in pair.params[k]] for k in range(KEPT)]
    if names[0] != names[1]:
        raise _NotPeriodic

    def unify(v1: Any, v0: Any) -> Any:
        if isinstance(v1, fx.Node) or isinstance(v0, fx.Node):
            if not (isinstance(v1, fx.Node) and isinstance(v0, fx.Node)):
                raise _NotPeriodic
            t1, t0 = _token(v1, 1, pair), _token(v0, 0, pair)
            if t1 == t0:
                return v1 if t1[0] == "shared" else _Ref(*t1)
            if t0[0] == "shared" and t1[1] == -1:  # the first layer reads the embeddings there
                return _Ref(*t1)
            if t1[0] == "shared" and t0[0] in ("F", "B") and t0[1] == 1:  # the last layer reads the head there
                return _Ref(*t0)
            raise _NotPeriodic
        if isinstance(v1, (list, tuple)):
            if not isinstance(v0, (list, tuple)) or len(v0) != len(v1):
                raise _NotPeriodic
            out = [unify(a, b) for a, b in zip(v1, v0)]
            return tuple(out) if isinstance(v1, tuple) else out
        if isinstance(v1, dict):
            if not isinstance(v0, dict) or list(v0) != list(v1):
                raise _NotPeriodic
            return {k: unify(v1[k], v0[k]) for k in v1}
        if type(v1) is not type(v0) or repr(v1) != repr(v0):
            raise _NotPeriodic
        return v1

    middle: dict[fx.Node, tuple[Any, Any]] = {}
    for part in ("fwd", "bwd"):
        zero, one = getattr(pair, part)
        if len(zero) != len(one):
            raise _NotPeriodic
        for a, b in zip(zero, one):
            if a.target != b.target or a.meta.get("partitioner_tag") != b.meta.get("partitioner_tag"):
                raise _NotPeriodic
            if [_rename(p, prefix, 0, 1) for p, _ in _stack(a).values()] != [p for p, _ in _stack(b).values()]:
                raise _NotPeriodic
            middle[b] = (unify(b.args, a.args), unify(b.kwargs, a.kwargs))
    return middle


def _fill(v: Any, resolve: Callable[[Any], CopiedNode]) -> Any:
    if isinstance(v, (_Ref, fx.Node)):
        return resolve(v)
    if isinstance(v, tuple):
        return tuple([_fill(x, resolve) for x in v])
    if isinstance(v, list):
        return [_fill(x, resolve) for x in v]
    if isinstance(v, dict):
        return {k: _fill(x, resolve) for k, x in v.items()}
    return v


def _flat_refs(spec: tuple[Any, Any]) -> list | None:
    """The nodes and ``_Ref``s of a middle node's (args, kwargs), in the order ``aten_capture._template``
    takes a node's tensor arguments (through lists and tuples, args first); None where a dict holds one
    (the template does not look inside dicts, so such a node is converted node by node)."""
    found: list = []

    def walk(v: Any, inside_dict: bool) -> bool:
        if isinstance(v, (_Ref, fx.Node)):
            found.append(v)
            return not inside_dict
        if isinstance(v, (list, tuple)):
            return all([walk(x, inside_dict) for x in v])
        if isinstance(v, dict):
            return all([walk(x, True) for x in v.values()])
        return True

    args, kwargs = spec
    return found if walk(args, False) and all([walk(v, False) for v in kwargs.values()]) else None


def _build(gm: fx.GraphModule, pair: _Pair, middle: dict, prefix: str, n_layers: int) -> _Nodes:
    """The whole stack's joint graph: layer 1 copied as layers 1..n-2 (middle arguments) and renamed n-1."""
    last = n_layers - 1
    shift = (n_layers - KEPT) * pair.period  # autograd numbers after the middle layers move by this
    threshold = min((n.meta["seq_nr"] for n in pair.fwd[1] if n.meta.get("seq_nr") is not None), default=0)

    def global_seq(s: int) -> int:  # a number that is no layer's own: the loss's, the head's
        return s + shift if s >= threshold else s

    out: list[CopiedNode] = []
    env: dict[fx.Node, CopiedNode] = {}  # captured node -> its node in the whole graph (layer 1's: as n-1)
    copies: dict[int, dict[fx.Node, CopiedNode]] = {}  # layer i (1..n-2) -> layer 1's node -> its copy

    def at(kind: str, layer: int, offset: int) -> fx.Node:
        return (pair.params if kind == "P" else pair.fwd if kind == "F" else pair.bwd)[layer][offset]

    def node_of(kind: str, j: int, offset: int) -> CopiedNode:
        """Layer ``j`` of the whole graph's node at (kind, offset)."""
        if j <= 0:
            return env[at(kind, 0, offset)]
        if j >= last:
            return env[at(kind, 1, offset)]
        return copies[j][at(kind, 1, offset)]

    def captured(i: int, own: int) -> Callable[[fx.Node], CopiedNode]:
        """Arguments as captured, of a node standing for layer ``i`` and captured in layer ``own``."""
        def f(v: fx.Node) -> CopiedNode:
            where = pair.region.get(v)
            if where is None:
                return env[v]
            kind, layer, offset = where
            return node_of(kind, i + layer - own, offset)
        return f

    def emit(node: fx.Node, i: int, own: int, args: Any, kwargs: Any, seq: Callable[[int], int],
             append: bool = True) -> CopiedNode:
        new = CopiedNode(node.op, node.target, args, kwargs, _rename_meta(node.meta, prefix, own, i, seq),
                         f"{node.name}.{i}")
        if append:
            out.append(new)
        return new

    def as_captured(node: fx.Node, i: int, own: int, seq: Callable[[int], int]) -> CopiedNode:
        f = captured(i, own)
        return emit(node, i, own, _map_nodes(node.args, f), _map_nodes(node.kwargs, f), seq)

    def copy_seq(node: fx.Node, i: int) -> Callable[[int], int]:
        return (lambda s: s + (i - 1) * pair.period) if pair.relative_seq.get(node, True) else global_seq

    def middle_copy(node: fx.Node, i: int, append: bool = True) -> CopiedNode:
        def resolve(v: Any) -> CopiedNode:
            return env[v] if isinstance(v, fx.Node) else node_of(v.kind, i + v.rel, v.offset)
        args, kwargs = middle.get(node, (node.args, node.kwargs))  # placeholders have none
        return emit(node, i, 1, _fill(args, resolve), _fill(kwargs, resolve), copy_seq(node, i), append)

    refs: dict[fx.Node, list | None] = {}  # layer 1's node -> what its copies read, in argument order

    def copied_layer(part: list[fx.Node], i: int, template: int) -> CopiedLayer:
        """Layer ``i``'s copy of ``part`` as one entry: ``template``'s converted ops with layer i's names."""
        stand_ins = [(t, copies[template][t], CopiedNode("stand_in", t.target, (), {}, {}, f"{t.name}.{i}"))
                     for t in part]
        copies[i].update((t, s) for t, _, s in stand_ins)

        def inputs(t: fx.Node) -> list | None:
            if t not in refs:
                refs[t] = _flat_refs(middle[t]) if t in middle else None
            found = refs[t]
            if found is None:
                return None
            return [env[v] if isinstance(v, fx.Node) else node_of(v.kind, i + v.rel, v.offset) for v in found]

        def seq(t: fx.Node) -> int | None:
            s = t.meta.get("seq_nr")
            return None if s is None else copy_seq(t, i)(s)

        return CopiedLayer(i, stand_ins, inputs, seq, lambda t: middle_copy(t, i, append=False),
                           lambda path: _rename(path, module_prefix, template, i), plans)

    plans: dict = {}  # the template layers' nodes -> how their copies are made (layer_copy._plan)

    module_prefix = prefix[len("m."):]  # op module paths are the model's, without the step's "m."

    def copy_layers(part: list[fx.Node], order: range) -> None:
        template = None
        for i in order:
            m = copies.setdefault(i, {})
            if template is not None and part is not pair.params[1] and COPY_OPS.on:
                out.append(copied_layer(part, i, template))
                continue
            for t in part:
                m[t] = middle_copy(t, i)
            template = i

    def as_last(part: list[fx.Node]) -> None:
        for t in part:
            env[t] = as_captured(t, last, 1, copy_seq(t, last))

    parts = {p[0]: p for p in (pair.params[1], pair.fwd[1], pair.bwd[1])}
    in_layer1 = {n for p in parts.values() for n in p}
    for node in gm.graph.nodes:
        if node.op == "output":
            _emit_output(out, node, prefix, last, env, copies)
        elif node in parts:
            part = parts[node]
            if part is pair.bwd[1]:  # backward runs from the last layer down
                as_last(part)
                copy_layers(part, range(last - 1, 0, -1))
            else:
                copy_layers(part, range(1, last))
                as_last(part)
        elif node in in_layer1:
            continue
        elif node in pair.head:
            env[node] = as_captured(node, last, 1, global_seq)
        else:
            env[node] = as_captured(node, 0, 0, global_seq)
    return _Nodes(out)


def _emit_output(out: list[CopiedNode], node: fx.Node, prefix: str, last: int, env: dict,
                 copies: dict[int, dict[fx.Node, CopiedNode]]) -> None:
    values, descs = list(node.args[0]), list(node.meta.get("desc", ()))
    res_v: list[Any] = []
    res_d: list[Any] = []

    def value(v: Any, i: int) -> Any:
        if not isinstance(v, fx.Node):
            return v
        return copies[i][v] if 0 < i < last else env[v]

    k = 0
    while k < len(values):
        if _output_layer(descs[k], prefix) == 1:  # layer 1's block stands for every layer 1..n-1
            end = k
            while end < len(values) and _output_layer(descs[end], prefix) == 1:
                end += 1
            for i in range(1, last + 1):
                for v, d in zip(values[k:end], descs[k:end]):
                    res_v.append(value(v, i))
                    res_d.append(_rename_desc(d, prefix, 1, i))
            k = end
            continue
        res_v.append(value(values[k], 0))
        res_d.append(descs[k])
        k += 1
    out.append(CopiedNode("output", "output", (tuple(res_v) if isinstance(node.args[0], tuple) else res_v,), {},
                          {**node.meta, "desc": res_d}, node.name))
