"""Reverse-mode autodiff on the logical graph: torch's own backward, as ordinary graph ops.

Walking the forward ops in reverse, each op's output gradients become its input gradients by the
backward torch's autograd runs for the op's kernel (``op_vjp.py``: traced once per op, shapes and
attrs, and spliced in as ATen ops that name the forward op, its module and source). A tensor read by
several ops sums its contributions with ``add``. Because the backward pass is made of registry ops,
SBP deduction treats it exactly like the forward: a batch-split activation times a broadcast weight
yields a ``P`` weight gradient by the signature of the backward's ``mm``, not by special case. With
micro-batches, ``acc`` ops sum each gradient over the micro-batches of a step.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...gc_pause import without_gc
from ..ir import Graph, GraphError, OpNode
from .op_vjp import backward_of


class _Emitter:
    """Adds the ops autodiff makes itself (the seed, sums of contributions) next to the op they serve."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.op: OpNode | None = None

    def emit(self, type: str, inputs: Sequence[str], attrs: dict | None = None) -> list[str]:
        op = self.op
        node = self.graph.add_op(type, inputs, attrs, phase="backward", module=op.module if op else "",
                                 source=op.source if op else "", forward_op=op.name if op else None)
        return list(node.outputs)


def _requires_grad(graph: Graph) -> set[str]:
    """Params, and every floating tensor computed from one."""
    req = {p for p in graph.params if graph.tensors[p].meta.dtype.is_floating_point}
    for op in graph.ops:
        if op.phase == "forward" and any(i in req for i in op.inputs):
            req.update(o for o in op.outputs if graph.tensors[o].meta.dtype.is_floating_point)
    return req


def differentiate(graph: Graph, loss: str, seed: float = 1.0) -> dict[str, str]:
    """Append the backward pass of ``loss`` to ``graph``; returns param -> gradient tensor.

    ``seed`` is d(objective)/d(loss): 1 for one batch, 1/M when the objective is the mean over M
    micro-batches. A parameter the loss does not depend on gets a zero gradient (and a warning in
    its name: ``fill``), so optimizers still see every parameter. Records each forward tensor's total
    gradient (``graph.tensor_grads``) and each forward op's gradient per input (``graph.input_grads``):
    hints by op name reach them (``input_grad=``).
    """
    if graph.tensors[loss].shape != ():
        raise GraphError(f"the loss {loss!r} must be a scalar, got shape {graph.tensors[loss].shape}; "
                         f"reduce it with mean or sum first")
    requires = _requires_grad(graph)
    if loss not in requires:
        raise GraphError(f"the loss {loss!r} does not depend on any parameter; nothing to train")
    ctx = _Emitter(graph)
    contribs: dict[str, list[str]] = {loss: ctx.emit("fill", [], {"shape": (), "value": float(seed)})}
    forward = [op for op in graph.ops if op.phase == "forward"]
    for op in reversed(forward):
        if not any(o in contribs for o in op.outputs) or not any(i in requires for i in op.inputs):
            continue
        ctx.op = op
        gouts = [_total(ctx, contribs.get(o)) for o in op.outputs]
        for o, go in zip(op.outputs, gouts):
            if go is not None:
                graph.tensor_grads[o] = go
        grads = backward_of(graph, op, [i in requires for i in op.inputs], gouts)
        graph.input_grads[op.name] = tuple(gi if inp in requires else None for inp, gi in zip(op.inputs, grads))
        for inp, gi in zip(op.inputs, grads):
            if gi is not None and inp in requires:
                contribs.setdefault(inp, []).append(gi)
    ctx.op = None
    out = {}
    for p in graph.params:
        if p not in requires:
            continue
        if p in contribs:
            out[p] = _total(ctx, contribs[p])
        else:
            out[p] = ctx.emit("fill", [], {"shape": graph.tensors[p].shape, "value": 0.0})[0]
    return out


def _total(ctx: _Emitter, parts: list[str] | None) -> str | None:
    """The sum of a tensor's gradient contributions (a chain of adds, in the order they came)."""
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = ctx.emit("add", [total, p])[0]
    parts[:] = [total]
    return total


@without_gc
def add_backward(graph: Graph, micro_batches: int = 1) -> None:
    """Extend a forward graph in place: gradients named ``<param>.grad``, and the step's loss.

    Only the final gradient of each parameter has role ``grad`` (what ZeRO shards); the
    backward's intermediate tensors are activations like any other.

    With ``micro_batches`` M > 1, forward and backward run M times per step on M slices of the
    batch; each gradient goes through ``acc`` (sum over micro-batches, seeded with 1/M so the sum
    is the gradient of the mean loss), and so does the loss (scaled by 1/M).
    """
    if graph.loss is None:
        raise GraphError("the graph has no loss; build it with a loss (from_torch(..., loss_fn=...))")
    if micro_batches < 1:
        raise GraphError(f"micro_batches must be >= 1, got {micro_batches}")
    graph.micro_batches = micro_batches
    grads = differentiate(graph, graph.loss, seed=1.0 / micro_batches)
    from ..frontend.aten_unmerge import unmerge_batched_matmuls

    held = {*grads.values(), *graph.tensor_grads.values(), *(g for gs in graph.input_grads.values() for g in gs if g)}
    unmerge_batched_matmuls(graph, protected=held)  # a 4-D matmul's backward keeps the heads a dim of their own
    attach_gradients(graph, grads, micro_batches)


def attach_gradients(graph: Graph, grads: dict[str, str], micro_batches: int) -> None:
    """Name each parameter's gradient ``<param>.grad`` (role ``grad``), summed over micro-batches by
    ``acc``, and set the step's loss value; ``grads`` maps param -> its gradient for one micro-batch
    (made by ``differentiate`` or by torch's autograd in an ATen capture)."""
    graph.micro_batches = micro_batches
    claimed: set[str] = set()
    for p, g in grads.items():
        module = graph.tensors[p].module
        if g in claimed or graph.tensors[g].consumers:
            # the gradient is also another tensor's gradient (x + bias): give the parameter its own
            # copy, so its layout (ZeRO shards it) does not change the other tensor's
            g = graph.add_op("scale", [g], {"factor": 1.0}, phase="backward", module=module).outputs[0]
        claimed.add(g)
        if micro_batches > 1:
            name = graph.fresh_name(f"{p}.grad_mb")
            graph.rename_tensor(g, name)
            node = graph.add_op("acc", [name], {"scale": 1.0}, phase="backward", out_names=[f"{p}.grad"],
                                module=module, role="grad")
            graph.grads[p] = node.outputs[0]
        else:
            graph.rename_tensor(g, f"{p}.grad")
            graph.grads[p] = f"{p}.grad"
        graph.tensors[graph.grads[p]].role = "grad"
    if micro_batches > 1:
        node = graph.add_op("acc", [graph.loss], {"scale": 1.0 / micro_batches}, phase="backward",
                            out_names=["loss.mean"])
        graph.loss_value = node.outputs[0]
    else:
        graph.loss_value = graph.loss
