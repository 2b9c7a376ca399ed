"""Gradient rules: for each forward op, the backward ops that turn output gradients into input ones.

A rule is attached to the registry's ``OpDef.grad``; it receives a ``GradContext`` to emit ops,
the forward op, and the gradient of each output (None where nothing flows back), and returns one
gradient per input (None where the input needs none: integer ids, targets, constants). Rules
only build graph ops; the signatures of those ops decide later how gradients are laid out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ...ops.registry import REGISTRY
from ..ir import OpNode


class GradContext(Protocol):
    def emit(self, type: str, inputs: Sequence[str], attrs: dict | None = None) -> list[str]: ...
    def shape(self, tensor: str) -> tuple[int, ...]: ...
    def needs(self, op: OpNode, index: int) -> bool: ...


Grads = list  # list[str | None], one per forward input
Rule = Callable[[GradContext, OpNode, list], Grads]
RULES: dict[str, Rule] = {}


def rule(*names: str):
    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return deco


def reduce_to(ctx: GradContext, g: str, shape: tuple[int, ...]) -> str:
    """Sum a broadcast result's gradient back to an operand's shape (torch broadcasting rules)."""
    gs = ctx.shape(g)
    if gs == shape:
        return g
    lead = len(gs) - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and gs[lead + i] != 1)
    return ctx.emit("grad_sum", [g], {"dims": dims, "squeeze": tuple(range(lead))})[0]


def _one(ctx: GradContext, type: str, inputs: Sequence[str], attrs: dict | None = None) -> str:
    return ctx.emit(type, inputs, attrs)[0]


@rule("linear")
def _linear(ctx, op, gouts):
    g = gouts[0]
    x, w = op.inputs[0], op.inputs[1]
    out: Grads = [None] * len(op.inputs)
    if ctx.needs(op, 0):
        out[0] = _one(ctx, "linear_grad_input", [g, w])
    if ctx.needs(op, 1):
        out[1] = _one(ctx, "linear_grad_weight", [g, x])
    if len(op.inputs) == 3 and ctx.needs(op, 2):
        out[2] = reduce_to(ctx, g, ctx.shape(op.inputs[2]))
    return out


@rule("matmul")
def _matmul(ctx, op, gouts):
    g = gouts[0]
    a, b = op.inputs
    out: Grads = [None, None]
    if len(ctx.shape(b)) == 2:  # a (..., m, k) @ b (k, n)
        if ctx.needs(op, 0):
            out[0] = _one(ctx, "linear", [g, b])  # g @ b.T
        if ctx.needs(op, 1):
            out[1] = _one(ctx, "linear_grad_weight", [a, g])  # sum over batch of a.T @ g
        return out
    if ctx.needs(op, 0):
        bt = _one(ctx, "transpose", [b], {"dim0": -1, "dim1": -2})
        out[0] = _one(ctx, "matmul", [g, bt])
    if ctx.needs(op, 1):
        at = _one(ctx, "transpose", [a], {"dim0": -1, "dim1": -2})
        out[1] = _one(ctx, "matmul", [at, g])
    return out


@rule("add", "sub")
def _add(ctx, op, gouts):
    g = gouts[0]
    out: Grads = [None, None]
    if ctx.needs(op, 0):
        out[0] = reduce_to(ctx, g, ctx.shape(op.inputs[0]))
    if ctx.needs(op, 1):
        gb = reduce_to(ctx, g, ctx.shape(op.inputs[1]))
        out[1] = _one(ctx, "neg", [gb]) if op.type == "sub" else gb
    return out


@rule("mul")
def _mul(ctx, op, gouts):
    g = gouts[0]
    a, b = op.inputs
    out: Grads = [None, None]
    if ctx.needs(op, 0):
        out[0] = reduce_to(ctx, _one(ctx, "mul", [g, b]), ctx.shape(a))
    if ctx.needs(op, 1):
        out[1] = reduce_to(ctx, _one(ctx, "mul", [g, a]), ctx.shape(b))
    return out


@rule("div")
def _div(ctx, op, gouts):
    g = gouts[0]
    a, b = op.inputs
    y = op.outputs[0]
    out: Grads = [None, None]
    t = _one(ctx, "div", [g, b])
    if ctx.needs(op, 0):
        out[0] = reduce_to(ctx, t, ctx.shape(a))
    if ctx.needs(op, 1):  # d(a/b)/db = -(a/b)/b
        out[1] = reduce_to(ctx, _one(ctx, "neg", [_one(ctx, "mul", [t, y])]), ctx.shape(b))
    return out


@rule("neg")
def _neg(ctx, op, gouts):
    return [_one(ctx, "neg", [gouts[0]])]


@rule("scale")
def _scale(ctx, op, gouts):
    return [_one(ctx, "scale", [gouts[0]], {"factor": op.attrs["factor"]})]


@rule("add_scalar")
def _add_scalar(ctx, op, gouts):
    return [gouts[0]]


@rule("relu", "tanh")
def _by_output(ctx, op, gouts):
    return [_one(ctx, f"{op.type}_grad", [gouts[0], op.outputs[0]])]


@rule("gelu")
def _gelu(ctx, op, gouts):
    return [_one(ctx, "gelu_grad", [gouts[0], op.inputs[0]], {"approximate": op.attrs.get("approximate", "none")})]


@rule("exp")
def _exp(ctx, op, gouts):
    return [_one(ctx, "mul", [gouts[0], op.outputs[0]])]


@rule("softmax", "log_softmax")
def _softmax(ctx, op, gouts):
    return [_one(ctx, f"{op.type}_grad", [gouts[0], op.outputs[0]], {"dim": op.attrs["dim"]})]


@rule("sum", "mean")
def _sum(ctx, op, gouts):
    x = op.inputs[0]
    shape = ctx.shape(x)
    dims = op.attrs.get("dims")
    dims = tuple(range(len(shape))) if dims is None or dims == () else (dims,) if isinstance(dims, int) else dims
    dims = tuple(sorted(d % len(shape) for d in dims)) if shape else ()
    count = 1
    for d in dims:
        count *= shape[d]
    scale = 1.0 / count if op.type == "mean" else 1.0
    return [_one(ctx, "sum_grad", [gouts[0]], {"out_shape": shape, "dims": dims,
                                               "keepdim": bool(op.attrs.get("keepdim", False)), "scale": scale})]


@rule("max", "min")
def _max(ctx, op, gouts):
    return [_one(ctx, "max_grad", [gouts[0], op.inputs[0]], {"dim": op.attrs["dim"], "mode": op.type,
                                                             "keepdim": bool(op.attrs.get("keepdim", False))})]


@rule("layer_norm")
def _layer_norm(ctx, op, gouts):
    x, w, _ = op.inputs
    dx, dw, db = ctx.emit("layer_norm_grad", [gouts[0], x, w], {"normalized_shape": op.attrs["normalized_shape"],
                                                                "eps": float(op.attrs.get("eps", 1e-5))})
    return [dx if ctx.needs(op, 0) else None, dw if ctx.needs(op, 1) else None, db if ctx.needs(op, 2) else None]


@rule("embedding")
def _embedding(ctx, op, gouts):
    ids, w = op.inputs
    attrs = {"num_embeddings": ctx.shape(w)[0]}
    if op.attrs.get("padding_idx") is not None:
        attrs["padding_idx"] = op.attrs["padding_idx"]
    return [None, _one(ctx, "embedding_grad", [gouts[0], ids], attrs)]


@rule("gather")
def _gather(ctx, op, gouts):
    x, index = op.inputs
    return [_one(ctx, "gather_grad", [gouts[0], index], {"out_shape": ctx.shape(x), "dim": op.attrs["dim"]}), None]


@rule("transpose")
def _transpose(ctx, op, gouts):
    return [_one(ctx, "transpose", [gouts[0]], dict(op.attrs))]


@rule("permute")
def _permute(ctx, op, gouts):
    dims = [d % len(op.attrs["dims"]) for d in op.attrs["dims"]]
    inverse = tuple(dims.index(i) for i in range(len(dims)))
    return [_one(ctx, "permute", [gouts[0]], {"dims": inverse})]


@rule("reshape", "view")
def _reshape(ctx, op, gouts):
    return [_one(ctx, "reshape", [gouts[0]], {"shape": ctx.shape(op.inputs[0])})]


@rule("concat")
def _concat(ctx, op, gouts):
    nd = len(ctx.shape(op.inputs[0]))
    dim = op.attrs.get("dim", 0) % nd
    out, start = [], 0
    for i, x in enumerate(op.inputs):
        n = ctx.shape(x)[dim]
        if ctx.needs(op, i):
            out.append(_one(ctx, "slice", [gouts[0]], {"dim": dim, "start": start, "stop": start + n, "step": 1}))
        else:
            out.append(None)
        start += n
    return out


@rule("slice")
def _slice(ctx, op, gouts):
    a = op.attrs
    return [_one(ctx, "slice_grad", [gouts[0]], {"out_shape": ctx.shape(op.inputs[0]), "dim": a.get("dim", 0),
                                                 "start": a.get("start"), "stop": a.get("stop"),
                                                 "step": a.get("step") or 1})]


@rule("cross_entropy")
def _cross_entropy(ctx, op, gouts):
    logits, target = op.inputs
    return [_one(ctx, "cross_entropy_grad", [gouts[0], logits, target]), None]


@rule("conv2d")
def _conv2d(ctx, op, gouts):
    g = gouts[0]
    x, w = op.inputs[0], op.inputs[1]
    conv = {k: op.attrs[k] for k in ("stride", "padding", "dilation", "groups") if k in op.attrs}
    out: Grads = [None] * len(op.inputs)
    if ctx.needs(op, 0):
        out[0] = _one(ctx, "conv2d_grad_input", [g, w], {"out_shape": ctx.shape(x), **conv})
    if ctx.needs(op, 1):
        out[1] = _one(ctx, "conv2d_grad_weight", [g, x], {"out_shape": ctx.shape(w), **conv})
    if len(op.inputs) == 3 and ctx.needs(op, 2):
        out[2] = _one(ctx, "grad_sum", [g], {"dims": (0, 2, 3), "squeeze": (0, 2, 3)})
    return out


def attach_rules() -> None:
    """Fill ``OpDef.grad`` for every registered op that has a rule (idempotent)."""
    for name, fn in RULES.items():
        if name in REGISTRY:
            REGISTRY[name].grad = fn
