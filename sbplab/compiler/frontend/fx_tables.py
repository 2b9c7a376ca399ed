"""The dispatch tables of the fx frontend: shape ops, indexing, leaf modules, and ``handle``."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from .from_torch import Converter, TRef, UnsupportedError, has_tensor
from .fx_handlers import (
    Handler,
    _arg,
    _binary,
    _conv2d_fn,
    _conv_attrs,
    _cross_entropy,
    _dims,
    _dropout,
    _embedding_fn,
    _layer_norm,
    _layer_norm_fn,
    _linear,
    _matmul,
    _max,
    _mse,
    _reduce,
    _reshape,
    _shape_args,
    _softmax,
    _unary,
)

# --- shape ops and indexing -------------------------------------------------------------------


def _view(cv, node, args, kwargs):
    if len(args) > 1 and isinstance(args[1], torch.dtype):
        raise UnsupportedError("view(dtype) reinterprets bits and is not supported")
    return _reshape(cv, args[0], _shape_args(args[1:]) if len(args) > 1 else tuple(kwargs["shape"]))


def _transpose(cv, node, args, kwargs):
    return cv.op("transpose", [args[0]], {"dim0": int(args[1]), "dim1": int(args[2])})


def _t(cv, node, args, kwargs):
    if len(cv.shape(args[0])) != 2:
        raise UnsupportedError(".t() / .T is supported on 2-D tensors only; use transpose")
    return cv.op("transpose", [args[0]], {"dim0": 0, "dim1": 1})


def _permute(cv, node, args, kwargs):
    dims = _shape_args(args[1:]) if len(args) > 1 else tuple(kwargs["dims"])
    return cv.op("permute", [args[0]], {"dims": dims})


def _flatten(cv, node, args, kwargs):
    x = args[0]
    shape = cv.shape(x)
    nd = len(shape)
    s = _arg(args, kwargs, 1, "start_dim", 0) % max(nd, 1)
    e = _arg(args, kwargs, 2, "end_dim", -1) % max(nd, 1)
    n = 1
    for d in shape[s:e + 1]:
        n *= d
    return _reshape(cv, x, shape[:s] + (n,) + shape[e + 1:])


def _unsqueeze(cv, node, args, kwargs):
    x, d = args[0], _arg(args, kwargs, 1, "dim")
    shape = list(cv.shape(x))
    d = d % (len(shape) + 1)
    return _reshape(cv, x, shape[:d] + [1] + shape[d:])


def _squeeze(cv, node, args, kwargs):
    x, d = args[0], _arg(args, kwargs, 1, "dim")
    shape = cv.shape(x)
    dims = set(range(len(shape))) if d is None else set(_dims(d, len(shape)))
    return _reshape(cv, x, [s for i, s in enumerate(shape) if not (i in dims and s == 1)])


def _slice(cv, x: TRef, dim: int, start, stop, step) -> TRef:
    n = cv.shape(x)[dim]
    r = range(n)[slice(start, stop, step)]
    if len(r) == n:
        return x
    if len(r) == 0:
        raise UnsupportedError(f"slicing dim {dim} to nothing is not supported")
    return cv.op("slice", [x], {"dim": dim, "start": r.start, "stop": r.stop if r.step > 0 else None,
                                "step": r.step})


def _getitem(cv, node, args, kwargs):
    x, idx = args
    if isinstance(x, (tuple, list)):
        v = x[idx]
        if v.__class__.__name__ == "_NoIndices":
            raise UnsupportedError("the indices of torch.max(x, dim) are not supported; use the values")
        return v
    if not isinstance(x, TRef):
        raise UnsupportedError(f"indexing a {type(x).__name__} is not supported")
    idx = idx if isinstance(idx, tuple) else (idx,)
    if any(isinstance(i, (TRef, torch.Tensor, list)) for i in idx):
        raise UnsupportedError("indexing with tensors or lists (advanced indexing) is not supported")
    nd = len(cv.shape(x))
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if Ellipsis in idx:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (nd - n_real) + idx[k + 1:]
    out_shape, dim = [], 0
    for i in idx:
        if i is None:
            out_shape.append(1)
            continue
        size = cv.shape(x)[dim]
        if isinstance(i, int):
            x = _slice(cv, x, dim, i % size, i % size + 1, 1)
        elif isinstance(i, slice):
            if i.step is not None and i.step < 0:
                raise UnsupportedError("negative slice steps are not supported")
            x = _slice(cv, x, dim, i.start, i.stop, i.step)
            out_shape.append(cv.shape(x)[dim])
        else:
            raise UnsupportedError(f"index {i!r} is not supported")
        dim += 1
    out_shape += list(cv.shape(x)[dim:])
    return _reshape(cv, x, out_shape)


def _split(cv, node, args, kwargs):
    x, size = args[0], _arg(args, kwargs, 1, "split_size_or_sections")
    if size is None:
        size = kwargs.get("split_size")
    dim = _arg(args, kwargs, 2, "dim", 0) % len(cv.shape(x))
    n = cv.shape(x)[dim]
    sizes = [size] * (n // size) + ([n % size] if n % size else []) if isinstance(size, int) else list(size)
    out, start = [], 0
    for s in sizes:
        out.append(_slice(cv, x, dim, start, start + s, 1))
        start += s
    return tuple(out)


def _chunk(cv, node, args, kwargs):
    x, chunks = args[0], _arg(args, kwargs, 1, "chunks")
    dim = _arg(args, kwargs, 2, "dim", 0) % len(cv.shape(x))
    n = cv.shape(x)[dim]
    size = -(-n // chunks)
    return _split(cv, node, (x, size, dim), {})


def _cat(cv, node, args, kwargs):
    xs = list(args[0])
    dim = _arg(args, kwargs, 1, "dim", 0) % len(cv.shape(xs[0]))
    return cv.op("concat", xs, {"dim": dim})


def _same(cv, node, args, kwargs):
    return args[0]


def _to(cv, node, args, kwargs):
    x = args[0]
    want = [a for a in list(args[1:]) + list(kwargs.values()) if isinstance(a, torch.dtype)]
    if want and want[0] != cv.dtype(x):
        raise UnsupportedError(f"changing dtype ({cv.dtype(x)} -> {want[0]}) is not supported")
    return x


def _float(cv, node, args, kwargs):
    if cv.dtype(args[0]) != torch.float32:
        raise UnsupportedError(f"converting {cv.dtype(args[0])} to float32 is not supported")
    return args[0]


def _getattr(cv, node, args, kwargs):
    x, name = args
    if name in ("T", "mT"):
        return _t(cv, node, (x,), {}) if name == "T" else _transpose(cv, node, (x, -1, -2), {})
    raise UnsupportedError(f"tensor attribute .{name} is not supported")


# --- leaf modules ------------------------------------------------------------------------------

def _mod_linear(cv, m: nn.Linear, path, x):
    ins = [x, cv.param(m.weight, f"{path}.weight")] + ([cv.param(m.bias, f"{path}.bias")] if m.bias is not None else [])
    return cv.op("linear", ins, name=path)


def _mod_layer_norm(cv, m: nn.LayerNorm, path, x):
    w = cv.param(m.weight, f"{path}.weight") if m.weight is not None else None
    b = cv.param(m.bias, f"{path}.bias") if getattr(m, "bias", None) is not None else None
    return _layer_norm(cv, x, tuple(m.normalized_shape), w, b, float(m.eps))


def _mod_embedding(cv, m: nn.Embedding, path, ids):
    if m.max_norm is not None or m.sparse:
        raise UnsupportedError("nn.Embedding with max_norm or sparse=True is not supported")
    attrs = {"padding_idx": m.padding_idx} if m.padding_idx is not None else {}
    return cv.op("embedding", [ids, cv.param(m.weight, f"{path}.weight")], attrs, name=path)


def _mod_conv2d(cv, m: nn.Conv2d, path, x):
    if m.padding_mode != "zeros":
        raise UnsupportedError(f"nn.Conv2d(padding_mode={m.padding_mode!r}) is not supported; use 'zeros'")
    ins = [x, cv.param(m.weight, f"{path}.weight")] + ([cv.param(m.bias, f"{path}.bias")] if m.bias is not None else [])
    return cv.op("conv2d", ins, _conv_attrs(m.stride, m.padding, m.dilation, m.groups), name=path)


def _mod_simple(fn: Handler, get_args=lambda m: ((), {})):
    def h(cv, m, path, *xs):
        a, k = get_args(m)
        return fn(cv, cv.node, tuple(xs) + a, k)
    return h


MODULES: dict[type, Any] = {
    nn.Linear: _mod_linear,
    nn.LayerNorm: _mod_layer_norm,
    nn.Embedding: _mod_embedding,
    nn.Conv2d: _mod_conv2d,
    nn.ReLU: _mod_simple(_unary("relu")),
    nn.Tanh: _mod_simple(_unary("tanh")),
    nn.GELU: _mod_simple(_unary("gelu"), lambda m: ((), {"approximate": m.approximate})),
    nn.Softmax: _mod_simple(_softmax("softmax"), lambda m: ((m.dim,), {})),
    nn.LogSoftmax: _mod_simple(_softmax("log_softmax"), lambda m: ((m.dim,), {})),
    nn.Identity: _mod_simple(_same),
    nn.Dropout: _mod_simple(_dropout, lambda m: ((m.p, m.training), {})),
    nn.Flatten: _mod_simple(_flatten, lambda m: ((m.start_dim, m.end_dim), {})),
    nn.CrossEntropyLoss: _mod_simple(_cross_entropy, lambda m: ((), {
        "reduction": m.reduction, "label_smoothing": m.label_smoothing, "ignore_index": m.ignore_index,
        "weight": m.weight})),
    nn.MSELoss: _mod_simple(_mse, lambda m: ((), {"reduction": m.reduction})),
}

FUNCTIONS: dict[Any, Handler] = {
    F.linear: _linear, torch.matmul: _matmul, operator.matmul: _matmul, torch.bmm: _matmul, torch.mm: _matmul,
    F.relu: _unary("relu"), torch.relu: _unary("relu"), F.gelu: _unary("gelu"), torch.tanh: _unary("tanh"),
    F.tanh: _unary("tanh"), torch.exp: _unary("exp"), operator.neg: _unary("neg"), torch.neg: _unary("neg"),
    F.softmax: _softmax("softmax"), torch.softmax: _softmax("softmax"),
    F.log_softmax: _softmax("log_softmax"), torch.log_softmax: _softmax("log_softmax"),
    F.layer_norm: _layer_norm_fn, F.embedding: _embedding_fn, F.cross_entropy: _cross_entropy,
    F.mse_loss: _mse, F.conv2d: _conv2d_fn, F.dropout: _dropout,
    torch.sum: _reduce("sum"), torch.mean: _reduce("mean"), torch.amax: _max, torch.max: _max,
    torch.cat: _cat, torch.concat: _cat, torch.transpose: _transpose, torch.permute: _permute,
    torch.reshape: lambda cv, n, a, k: _reshape(cv, a[0], tuple(a[1])), torch.flatten: _flatten,
    torch.unsqueeze: _unsqueeze, torch.squeeze: _squeeze, torch.split: _split, torch.chunk: _chunk,
    operator.getitem: _getitem, getattr: _getattr,
}
for _name in ("add", "sub", "mul"):
    FUNCTIONS[getattr(operator, _name)] = _binary(_name)
    FUNCTIONS[getattr(operator, f"i{_name}")] = _binary(_name)
    FUNCTIONS[getattr(torch, _name)] = _binary(_name)
FUNCTIONS[operator.truediv] = FUNCTIONS[operator.itruediv] = FUNCTIONS[torch.div] = _binary("div")

METHODS: dict[str, Handler] = {
    "view": _view, "reshape": _view, "transpose": _transpose, "permute": _permute, "t": _t,
    "softmax": _softmax("softmax"), "log_softmax": _softmax("log_softmax"), "relu": _unary("relu"),
    "tanh": _unary("tanh"), "exp": _unary("exp"), "neg": _unary("neg"), "sum": _reduce("sum"),
    "mean": _reduce("mean"), "amax": _max, "max": _max, "contiguous": _same, "flatten": _flatten,
    "unsqueeze": _unsqueeze, "squeeze": _squeeze, "split": _split, "chunk": _chunk, "matmul": _matmul,
    "add": _binary("add"), "sub": _binary("sub"), "mul": _binary("mul"), "div": _binary("div"),
    "float": _float, "to": _to, "type_as": _same,
}


def handle(cv: Converter, node: fx.Node, args: tuple, kwargs: dict) -> Any:
    """Map one fx node; constants-only calls are evaluated directly."""
    if node.op == "call_module":
        mod = cv.root.get_submodule(node.target)
        h = MODULES.get(type(mod))
        if h is None:
            raise UnsupportedError("no mapping to sbplab ops for this module; write it with supported "
                                   "functions, or register an op and a handler")
        return h(cv, mod, cv.prefix + str(node.target), *args)
    if not has_tensor(args, kwargs):  # constants only: evaluate now
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        h = METHODS.get(node.target)
    else:
        try:
            h = FUNCTIONS.get(node.target)
        except TypeError:  # unhashable target
            h = None
    if h is None:
        raise UnsupportedError("no mapping to sbplab ops for this call")
    return h(cv, node, args, kwargs)


def has_mapping(cv: Converter, node: fx.Node) -> bool:
    """Whether a handler exists for the node's target, whatever its arguments (used to report
    unsupported calls downstream of another unsupported call)."""
    if node.op == "call_module":
        return type(cv.root.get_submodule(node.target)) in MODULES
    if node.op == "call_method":
        return node.target in METHODS
    try:
        return node.target in FUNCTIONS
    except TypeError:
        return False
