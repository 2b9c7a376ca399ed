"""Copied layers made at graph level: the ops of a middle layer converted once, then repeated as ops.

``layer_pair`` builds a deep stack's joint graph from a capture of two layers; its middle layers are all
one layer's nodes with other names. Converting each copy's nodes one by one (``aten_capture._call``:
argument templates, frozen attributes, shape inference, module and source lookups) repeats for every
layer what the first copy already worked out, about 20 microseconds a node, 7,000 nodes on a 32-layer
Llama. Here the first middle copy of each part (forward, backward) is converted as usual, and every other
copy is one ``CopiedLayer`` entry: its ops are the first copy's ops with the layer's own names, modules,
inputs and autograd numbers, their attributes and output shapes taken as they are (the inputs' shapes are
checked equal first; where they are not, the op is inferred as ``Graph.add_op`` would). Names come from
``Graph.fresh_name`` exactly as ``add_op`` names them, and ops are appended in the order a node-by-node
conversion appends them, so the graph is the same op for op (tests compare it with a whole capture).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import Any

import torch

from ...ops.aten.calls import ALIASES, SKIPPED, op_name
from ...shortcut import Shortcut
from ..ir import Graph, OpNode, TensorNode

COPY_OPS = Shortcut()


def node_by_node() -> contextlib.AbstractContextManager[None]:
    """Convert every copied layer's nodes one by one inside this block (the long way, for comparison)."""
    return COPY_OPS.off()


class CopiedLayer:
    """One middle layer of the stack, copied from the converted ``template`` layer.

    ``nodes``: (template fx node, its converted copy in the template layer, this layer's stand-in node)
    for each node of the part, in order; ``inputs(t)``: the nodes whose graph tensors node ``t``'s copy
    reads in this layer, in argument order (None: an argument the fast path does not handle);
    ``seq(t)``: the copy's autograd sequence number; ``materialize(t)``: the copy as a full node, for the
    node-by-node conversion where the fast path does not apply. ``rename(path)``: a module path of the
    template layer as this layer's."""

    op = "copied_layer"
    __slots__ = ("layer", "nodes", "inputs", "seq", "materialize", "rename", "plans")

    def __init__(self, layer: int, nodes: list[tuple[Any, Any, Any]], inputs: Callable[[Any], list | None],
                 seq: Callable[[Any], int | None], materialize: Callable[[Any], Any],
                 rename: Callable[[str], str], plans: dict) -> None:
        self.layer, self.nodes, self.inputs, self.seq = layer, nodes, inputs, seq
        self.materialize, self.rename = materialize, rename
        self.plans = plans  # template node -> how its copies are made (``_plan``), shared by the part's layers


def copy_layer(g: Graph, layer: CopiedLayer, env: dict, seq_op: dict[int, str], replicated: dict[str, set[str]],
               convert: Callable[[Any], None]) -> None:
    """Append ``layer``'s ops to ``g`` and map its stand-in nodes in ``env`` (fx-like node -> tensor name, a
    tuple of names, or None), as ``convert`` (the node-by-node conversion) would."""
    tensors = g.tensors
    for t, made, stand_in in layer.nodes:
        how = layer.plans.get(made)
        if how is None:
            how = layer.plans[made] = _plan(g, t, made, env)
        if not _fast(g, layer, t, how, stand_in, env, seq_op, replicated, tensors):
            node = layer.materialize(t)
            convert(node)
            env[stand_in] = env[node]


_GETITEM, _NONE, _ALIAS, _OP, _SLOW = range(5)


def _plan(g: Graph, t: Any, made: Any, env: dict) -> tuple:
    """How every copy of template node ``t`` is made (the same for every layer): (kind, ...)."""
    if t.op != "call_function":
        return (_SLOW,)
    if t.target is operator.getitem:
        return (_GETITEM, t.args[1])
    if not isinstance(t.target, torch._ops.OpOverload):
        return (_SLOW,)
    name = op_name(t.target)
    if name in SKIPPED:
        return (_NONE,)
    if name in ALIASES:
        return (_ALIAS,)
    first = env.get(made)
    out = first[0] if isinstance(first, tuple) and first else first
    if not isinstance(out, str):
        return (_SLOW,)
    template = g.op_by_name[g.tensors[out].producer]
    outs = template.outputs
    return (_OP, template, [g.tensors[x].meta for x in template.inputs], t.target._opname,
            [(g.tensors[o].meta, g.tensors[o].role) for o in outs], isinstance(first, tuple),
            template.phase == "backward")


def _fast(g: Graph, layer: CopiedLayer, t: Any, how: tuple, stand_in: Any, env: dict, seq_op: dict[int, str],
          replicated: dict[str, set[str]], tensors: dict[str, TensorNode]) -> bool:
    """The copy of ``t`` made as ``how`` says; False where the node-by-node conversion must make it."""
    kind = how[0]
    if kind == _SLOW:
        return False
    args = layer.inputs(t)
    if args is None:
        return False
    if kind == _GETITEM:
        src = env.get(args[0]) if args else None
        if not isinstance(src, tuple):
            return False
        env[stand_in] = src[how[1]]
        return True
    if kind == _NONE:
        env[stand_in] = None
        return True
    if kind == _ALIAS:
        if not args:
            return False
        env[stand_in] = env[args[0]]
        return True
    _, template, metas, opname, outs, multi, backward = how
    inputs = [env[a] for a in args]
    if len(inputs) != len(metas) or not all(isinstance(x, str) for x in inputs):
        return False
    if [tensors[x].meta for x in inputs] != metas:
        return False  # another shape than the template's: inferred afresh
    module = layer.rename(template.module)
    seq = layer.seq(t)
    new = g.fresh_name(f"{module}.{opname}" if module else opname)
    op = OpNode(new, template.type, inputs, [], dict(template.attrs), template.phase, module, template.source,
                forward_op=seq_op.get(seq) if backward and seq is not None else None)
    g.op_by_name[new] = op
    names = [new] if len(outs) == 1 else [f"{new}.{j}" for j in range(len(outs))]
    for n, (meta, role) in zip(names, outs):
        n = n if n not in tensors else g.fresh_name(n)
        tensors[n] = TensorNode(n, meta, role, producer=new, module=module)
        op.outputs.append(n)
    for x in inputs:
        tensors[x].consumers.append(new)
    g.ops.append(op)
    if not backward and seq is not None:
        seq_op[seq] = new
    if template.type in replicated:
        replicated[template.type].add(module)
    env[stand_in] = tuple(op.outputs) if multi else op.outputs[0]
    return True
