"""Activation recomputation: the backward recomputes forward activations instead of keeping them.

A pass on the training graph (any capture: sbplab's own ops or ATen), after autodiff. For each
recompute region it clones, into the backward phase, the region's forward ops that the backward
needs, and points the backward's reads at the clones, so the forward's own outputs die as soon as
the forward is done with them. The clones are placed just before the first backward op that reads
them: the runtime's compute lane fires the lowest ready op first, so a layer is recomputed when its
backward comes (``torch.utils.checkpoint`` per layer), not during the forward.

- ``"full"`` (Megatron's full recomputation): a region is one layer, the forward ops whose module
  path shares a prefix up to its first index (``blocks.3``, ``transformer.h.3``, ``model.layers.3``):
  the repeated blocks of a model. It keeps only what enters the layer (its input, the parameters).
- ``"selective"`` (Megatron-LM v3, Korthikanti et al. 2022): a region is one attention core, the
  ops of the attention module from the score matmul through the softmax to the matmul with the
  values (or one fused scaled-dot-product-attention op): the (B, H, T, T) tensors that are large and
  cheap to recompute. Q, K and V stay saved.

Random ops (dropout) are never cloned: their outputs stay saved (recomputing them would draw a new
mask; torch.utils.checkpoint replays the RNG instead, which a graph op cannot do), so the values
are exactly those of the run without recomputation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ...gc_pause import without_gc
from ..ir import Graph, OpNode

SUFFIX = ".recompute"  # op and tensor names of the clones: ``blocks.0.mlp.fc1.recompute``
MATMULS = ("matmul", "bmm", "mm", "baddbmm", "addmm", "linear")
RANDOM = ("dropout", "rand", "bernoulli", "normal", "multinomial")
_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")  # "blocks.0.attn.q" -> "blocks.0"


@dataclass
class RecomputeReport:
    """What the pass did: the regions, the forward ops it cloned, the saved tensors it freed."""

    mode: str
    regions: dict[str, list[str]] = field(default_factory=dict)  # region -> forward ops recomputed
    freed: list[str] = field(default_factory=list)  # forward tensors the backward no longer reads

    @property
    def cloned(self) -> int:
        return sum(len(v) for v in self.regions.values())

    def __str__(self) -> str:
        return (f"recompute={self.mode!r}: {self.cloned} forward ops recomputed in {len(self.regions)} "
                f"region(s), {len(self.freed)} saved activations freed")


def _base(op_type: str) -> str:
    """``aten.bmm.default`` -> ``bmm``; sbplab ops are their own name."""
    parts = op_type.split(".")
    return parts[1] if parts[0] == "aten" and len(parts) > 1 else op_type


def is_random(op: OpNode) -> bool:
    return any(r in _base(op.type) for r in RANDOM)


def is_matmul(op: OpNode) -> bool:
    return _base(op.type) in MATMULS


def is_softmax(op: OpNode) -> bool:
    b = _base(op.type)
    return "softmax" in b and "log_softmax" not in b and "backward" not in b


def is_attention(op: OpNode) -> bool:
    return "scaled_dot_product" in _base(op.type) and "backward" not in _base(op.type)


def layer_of(module: str) -> str | None:
    """The layer a module path belongs to (``blocks.3``), None outside the repeated blocks."""
    m = _LAYER.match(module)
    return m.group(1) if m else None


def full_regions(g: Graph) -> dict[str, list[OpNode]]:
    """One region per layer: the forward ops of ``blocks.<i>`` (whatever the container's name)."""
    out: dict[str, list[OpNode]] = {}
    for op in g.ops_in("forward"):
        layer = layer_of(op.module)
        if layer is not None:
            out.setdefault(layer, []).append(op)
    return out


def selective_regions(g: Graph) -> dict[str, list[OpNode]]:
    """One region per attention core: from the score matmul through the softmax to the value matmul,
    within the softmax's module; a fused attention op is a region by itself."""
    out: dict[str, list[OpNode]] = {}
    for op in g.ops_in("forward"):
        if is_attention(op):
            out[op.name] = [op]
        elif is_softmax(op):
            out[op.name] = _attention_core(g, op)
    return out


def _attention_core(g: Graph, softmax: OpNode) -> list[OpNode]:
    mod = softmax.module

    def inside(op: OpNode | None) -> bool:
        return (op is not None and op.phase == "forward" and not is_random(op)
                and (op.module == mod or op.module.startswith(mod + ".") or not mod))

    core = {softmax.name}
    todo = [softmax]
    while todo:  # back to the score matmul (included, its inputs Q and K are not)
        op = todo.pop()
        if op is not softmax and is_matmul(op):
            continue
        for i in op.inputs:
            p = g.producer(i)
            if inside(p) and p.name not in core and g.tensors[i].meta.dtype.is_floating_point:
                core.add(p.name)
                todo.append(p)
    todo = [softmax]
    while todo:  # forward to the matmul with the values (included)
        op = todo.pop()
        if op is not softmax and is_matmul(op):
            continue
        for o in op.outputs:
            for c in g.consumers(o):
                if inside(c) and c.name not in core:
                    core.add(c.name)
                    todo.append(c)
    return [op for op in g.ops if op.name in core]


@without_gc
def apply_recompute(g: Graph, mode: str) -> RecomputeReport:
    """Clone each region's needed forward ops into the backward of ``g`` (in place); see the module doc."""
    report = RecomputeReport(mode)
    if mode == "none":
        return report
    regions = full_regions(g) if mode == "full" else selective_regions(g)
    position = {op.name: k for k, op in enumerate(g.ops)}
    for key, ops in regions.items():
        inside = {op.name for op in ops if not is_random(op)}
        readers: dict[str, list[OpNode]] = {}  # region tensor -> the backward ops that read it
        for op in ops:
            if op.name not in inside:
                continue
            for o in op.outputs:
                back = [c for c in g.consumers(o) if c.phase == "backward"]
                kept = any(c.phase == "forward" and c.name not in inside for c in g.consumers(o))
                if back and not kept:  # a region's output is the next one's input: it stays saved
                    readers[o] = back
        if not readers:
            continue
        first = min(position[c.name] for cs in readers.values() for c in cs)
        token = _token(g, first)
        clones: dict[str, str] = {}  # forward tensor -> its recomputed twin
        made: list[OpNode] = []
        gated: dict[str, str] = {}  # tensor the region reads from outside -> the same, after ``token``
        gate = functools.partial(_gate, g, token=token, gated=gated, made=made)
        for t in readers:
            _clone_to(g, t, inside, clones, made, gate)
        _move_before(g, made, first)
        position = {op.name: k for k, op in enumerate(g.ops)}
        for t, cs in readers.items():
            for c in cs:
                for _ in range(c.inputs.count(t)):
                    g.tensors[t].consumers.remove(c.name)
                    g.tensors[clones[t]].consumers.append(c.name)
                c.inputs = [clones[t] if i == t else i for i in c.inputs]
            report.freed.append(t)
        report.regions[key] = [op.forward_op for op in made if op.type != "after"]
    g.validate()
    return report


def _token(g: Graph, index: int) -> str:
    """What the region's recomputation waits for: a gradient that op ``index`` (the region's first
    backward reader) reads itself, so the token is where that op runs (no transfer between pipeline
    stages just to order); else the backward tensor made just before it."""
    for i in g.ops[index].inputs:
        p = g.producer(i)
        if p is not None and p.phase == "backward":
            return i
    for op in reversed(g.ops[:index]):
        if op.phase == "backward":
            return op.outputs[0]
    raise ValueError(f"no backward op before op {index}: nothing to order the recomputation after")


def _gate(g: Graph, x: str, owner: OpNode, token: str, gated: dict[str, str], made: list[OpNode]) -> str:
    """``x`` read through ``after(x, token)`` (once per region): the clones fire in the backward. It
    belongs with ``owner``, the forward op whose clone reads it (a pipeline puts it on that stage)."""
    if x not in gated:
        node = g.add_op("after", [x, token], name=f"{x}.after", phase="backward", module=owner.module,
                        forward_op=owner.name)
        made.append(node)
        gated[x] = node.outputs[0]
    return gated[x]


def _clone_to(g: Graph, tensor: str, inside: set[str], clones: dict[str, str], made: list[OpNode],
              gate: Callable[[str, OpNode], str]) -> str:
    """The recomputed twin of ``tensor``, cloning its producer (and, first, the producers of its
    inputs) while they are in the region; anything made outside the region is read through ``gate``."""
    if tensor in clones:
        return clones[tensor]
    op = g.producer(tensor)
    if op is None or op.name not in inside:
        return tensor
    stack = [op]  # iterative post-order (layers have hundreds of ops)
    while stack:
        cur = stack[-1]
        pending = [g.producer(i) for i in cur.inputs if i not in clones]
        pending = [p for p in pending if p is not None and p.name in inside and p.outputs[0] not in clones]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        if cur.outputs[0] in clones:
            continue
        node = g.add_op(cur.type, _clone_inputs(g, cur, clones, gate), cur.attrs, name=cur.name + SUFFIX,
                        out_names=[o + SUFFIX for o in cur.outputs], phase="backward", module=cur.module,
                        source=cur.source, forward_op=cur.name)
        made.append(node)
        clones.update(zip(cur.outputs, node.outputs))
    return clones[tensor]


def _clone_inputs(g: Graph, op: OpNode, clones: dict[str, str], gate: Callable[[str, OpNode], str]) -> list[str]:
    """A clone's inputs: its region's clones, activations from outside through ``gate``, parameters and
    constants as they are (always alive; gating them would only alias them), unless a clone reads
    nothing else (the weight cast of a mixed-precision layer), which then waits through its first."""
    inputs = op.inputs
    out = [clones[i] if i in clones else i if g.tensors[i].is_source else gate(i, op) for i in inputs]
    if inputs and all(g.tensors[i].is_source for i in inputs):
        out[0] = gate(inputs[0], op)
    return out


def _move_before(g: Graph, made: list[OpNode], index: int) -> None:
    """Move the just-appended ``made`` ops (in their order) to ``index`` in the op list."""
    ids = {id(op) for op in made}
    rest = [op for op in g.ops if id(op) not in ids]
    g.ops[:] = rest[:index] + made + rest[index:]


def activation_peak(g: Graph) -> int:
    """Peak bytes of live activations (forward and backward temporaries) walking ``g.ops`` in order,
    each freed after its last reader: the logical graph's liveness, one micro-batch."""
    last: dict[str, int] = {}
    for k, op in enumerate(g.ops):
        for i in op.inputs:
            last[i] = k
    live = peak = 0
    ends: dict[int, int] = {}
    for k, op in enumerate(g.ops):
        for o in op.outputs:
            t = g.tensors[o]
            nbytes = t.meta.dtype.itemsize
            for s in t.shape:
                nbytes *= s
            live += nbytes
            end = last.get(o, k)
            ends[end] = ends.get(end, 0) + nbytes
        peak = max(peak, live)
        live -= ends.pop(k, 0)
    return peak
