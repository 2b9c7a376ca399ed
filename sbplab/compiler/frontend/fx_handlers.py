"""What each torch module, function and tensor method becomes in registry ops.

Three tables: leaf modules by type, functions by identity, tensor methods by name. A handler gets
the converter, the fx node and the resolved arguments (graph tensors are ``TRef``), and returns
the result; raising ``UnsupportedError`` records the node for the single error ``from_torch``
raises. Calls on constants only never reach a handler: they are evaluated while converting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .from_torch import Converter, TRef, UnsupportedError

Handler = Callable[[Converter, fx.Node, tuple, dict], Any]


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _dims(v: Any, nd: int) -> tuple[int, ...] | None:
    if v is None:
        return None
    v = (v,) if isinstance(v, int) else tuple(v)
    return tuple(d % nd for d in v)


def _shape_args(args: tuple) -> tuple[int, ...]:
    s = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
    return tuple(int(x) for x in s)


def _reshape(cv: Converter, x: TRef, shape) -> TRef:
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in cv.shape(x):
        n *= s
    if -1 in shape:
        known = 1
        for s in shape:
            known *= s if s != -1 else 1
        shape = tuple(n // known if s == -1 else s for s in shape)
    return x if shape == cv.shape(x) else cv.op("reshape", [x], {"shape": shape})


# --- arithmetic -----------------------------------------------------------------------------

def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _binary(name: str) -> Handler:
    def h(cv, node, args, kwargs):
        a, b = args[0], args[1] if len(args) > 1 else kwargs["other"]
        if kwargs.get("alpha", 1) != 1:
            raise UnsupportedError("alpha != 1 is not supported; scale the operand instead")
        if _is_num(b) and isinstance(a, TRef):
            if name == "mul":
                return cv.op("scale", [a], {"factor": float(b)})
            if name == "div":
                return cv.op("scale", [a], {"factor": 1.0 / float(b)})
            return cv.op("add_scalar", [a], {"value": float(b) if name == "add" else -float(b)})
        if _is_num(a) and isinstance(b, TRef):
            if name == "mul":
                return cv.op("scale", [b], {"factor": float(a)})
            if name == "add":
                return cv.op("add_scalar", [b], {"value": float(a)})
            if name == "sub":
                return cv.op("add_scalar", [cv.op("neg", [b])], {"value": float(a)})
            raise UnsupportedError("a number divided by a tensor is not supported (no reciprocal op)")
        return cv.op(name, [a, b])
    return h


def _unary(op: str, **fixed) -> Handler:
    def h(cv, node, args, kwargs):
        attrs = dict(fixed)
        if op == "gelu":
            attrs["approximate"] = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
        return cv.op(op, [args[0]], attrs)
    return h


def _softmax(op: str) -> Handler:
    def h(cv, node, args, kwargs):
        dim = _arg(args, kwargs, 1, "dim")
        if dim is None:
            raise UnsupportedError(f"{op} needs an explicit dim")
        if kwargs.get("dtype") is not None:
            raise UnsupportedError(f"{op}(dtype=...) is not supported")
        return cv.op(op, [args[0]], {"dim": int(dim)})
    return h


def _reduce(op: str) -> Handler:
    def h(cv, node, args, kwargs):
        x = args[0]
        dim = _arg(args, kwargs, 1, "dim")
        keep = bool(_arg(args, kwargs, 2, "keepdim", False))
        if kwargs.get("dtype") is not None:
            raise UnsupportedError(f"{op}(dtype=...) is not supported")
        return cv.op(op, [x], {"dims": _dims(dim, len(cv.shape(x))), "keepdim": keep})
    return h


class MaxResult(tuple):
    """torch.max(x, dim) returns (values, indices); only the values can be used."""


def _max(cv, node, args, kwargs):
    x = args[0]
    dim = _arg(args, kwargs, 1, "dim")
    if dim is None or isinstance(dim, TRef):
        raise UnsupportedError("max without dim (or of two tensors) is not supported; use amax(x, dim)")
    keep = bool(_arg(args, kwargs, 2, "keepdim", False))
    vals = cv.op("max", [x], {"dim": int(dim), "keepdim": keep})
    if node.target in (torch.amax, "amax"):
        return vals
    return MaxResult((vals, _NoIndices()))


class _NoIndices:
    """Stands for argmax indices, which no op produces; using them is reported."""


def _matmul(cv, node, args, kwargs):
    return cv.op("matmul", [args[0], args[1]])


def _linear(cv, node, args, kwargs):
    b = _arg(args, kwargs, 2, "bias")
    return cv.op("linear", [args[0], args[1]] + ([b] if b is not None else []))


def _layer_norm_fn(cv, node, args, kwargs):
    x, ns = args[0], _arg(args, kwargs, 1, "normalized_shape")
    w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
    return _layer_norm(cv, x, tuple(ns), w, b, float(_arg(args, kwargs, 4, "eps", 1e-5)))


def _layer_norm(cv, x, ns, w, b, eps):
    w = w if w is not None else torch.ones(ns)
    b = b if b is not None else torch.zeros(ns)
    return cv.op("layer_norm", [x, w, b], {"normalized_shape": ns, "eps": eps})


def _embedding_fn(cv, node, args, kwargs):
    for k in ("max_norm", "sparse"):
        if kwargs.get(k):
            raise UnsupportedError(f"embedding({k}=...) is not supported")
    pad = _arg(args, kwargs, 2, "padding_idx")
    return cv.op("embedding", [args[0], args[1]], {"padding_idx": pad} if pad is not None else {})


def _cross_entropy(cv, node, args, kwargs):
    if kwargs.get("weight") is not None or kwargs.get("label_smoothing", 0.0) or \
            kwargs.get("reduction", "mean") != "mean" or kwargs.get("ignore_index", -100) != -100:
        raise UnsupportedError("cross_entropy is supported with reduction='mean' and no weight, "
                               "label_smoothing or ignore_index")
    return cv.op("cross_entropy", [args[0], args[1]])


def _mse(cv, node, args, kwargs):
    if kwargs.get("reduction", "mean") != "mean":
        raise UnsupportedError("mse_loss is supported with reduction='mean'")
    d = cv.op("sub", [args[0], args[1]])
    return cv.op("mean", [cv.op("mul", [d, d])], {"dims": None, "keepdim": False})


def _conv_attrs(stride, padding, dilation, groups) -> dict:
    if isinstance(padding, str):
        if padding != "valid":
            raise UnsupportedError(f"conv2d padding={padding!r} is not supported; give the padding as ints")
        padding = 0
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    return {"stride": pair(stride), "padding": pair(padding), "dilation": pair(dilation), "groups": int(groups)}


def _conv2d_fn(cv, node, args, kwargs):
    b = _arg(args, kwargs, 2, "bias")
    attrs = _conv_attrs(_arg(args, kwargs, 3, "stride", 1), _arg(args, kwargs, 4, "padding", 0),
                        _arg(args, kwargs, 5, "dilation", 1), _arg(args, kwargs, 6, "groups", 1))
    return cv.op("conv2d", [args[0], args[1]] + ([b] if b is not None else []), attrs)


def _dropout(cv, node, args, kwargs):
    p = _arg(args, kwargs, 1, "p", 0.5)
    training = _arg(args, kwargs, 2, "training", True)
    if p and training:
        raise UnsupportedError("dropout with p > 0 in training is random; use p=0 (the compiler does not model RNG)")
    return args[0]
