"""Memo of the tracer's meta computations: identical layers ask identical questions.

The tracer runs every recorded call on meta tensors to learn its output shape. Meta kernels are
Python decompositions (a meta ``linear`` costs about a millisecond), and a 24-layer transformer asks
the same few dozen questions 24 times. The answer depends only on what the call is and on the
shapes, strides and dtypes it reads, so it is kept under exactly that key.

Only calls that cannot have side effects or hidden inputs are memoised: torch functions, operators
and tensor methods that do not work in place, and torch.nn leaf modules without submodules (their
plain attributes, parameter and buffer shapes are part of the key). Every hit hands back fresh meta
tensors, so two nodes never share one meta object (an in-place op on one would change the other);
a call whose result is one of its own inputs is never memoised.
"""

from __future__ import annotations

from typing import Any

import torch

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_MODULE_STATE = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")
_PURE_MODULES = ("torch", "_operator", "operator", "math", "builtins")


class NoKey(Exception):
    """A value the memo cannot describe exactly: the call is computed, not memoised."""


NOT_MEMOISED = object()  # a stored answer meaning "compute this call every time"
FAILED = object()  # a stored answer meaning "the meta computation raised"


def key_of(x: Any) -> Any:
    """A hashable, exact description of one argument of a meta call."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "meta" or type(x) is not torch.Tensor:
            raise NoKey
        return ("T", tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.requires_grad)
    if isinstance(x, _PLAIN):
        if isinstance(x, float) and x != x:  # NaN never equals itself
            raise NoKey
        return (type(x), x)
    if isinstance(x, (tuple, list)):
        if type(x) not in (tuple, list, torch.Size):
            raise NoKey
        return (type(x), tuple(key_of(y) for y in x))
    if isinstance(x, dict):
        return (dict, tuple((k, key_of(v)) for k, v in x.items()))
    if isinstance(x, slice):
        return (slice, key_of(x.start), key_of(x.stop), key_of(x.step))
    if x is Ellipsis:
        return (type(x),)
    raise NoKey


def call_key(kind: str, target: Any, args: Any, kwargs: Any, module: torch.nn.Module | None) -> tuple:
    """The memo key of one recorded call, or raise NoKey if it must be computed every time."""
    if kind == "call_function":
        mod = getattr(target, "__module__", None) or ""
        if not (mod in _PURE_MODULES or mod.startswith("torch.")) or mod.startswith("torch._ops") \
                or getattr(target, "__name__", "").endswith("_"):
            raise NoKey
        head: Any = target
    elif kind == "call_method":
        if not isinstance(target, str) or target.endswith("_") or not hasattr(torch.Tensor, target):
            raise NoKey
        head = target
    elif kind == "call_module":
        head = _module_key(module)
    else:
        raise NoKey
    if "out" in kwargs:
        raise NoKey
    return (kind, head, key_of(args), key_of(kwargs), torch.get_default_dtype(), torch.is_autocast_enabled())


def _module_key(mod: torch.nn.Module | None) -> tuple:
    if mod is None or mod._modules or not type(mod).__module__.startswith(("torch.nn.", "torch.ao.nn.")):
        raise NoKey
    attrs = []
    for k, v in vars(mod).items():
        if k in _MODULE_STATE or "hook" in k:
            continue
        attrs.append((k, key_of(v)))
    tensors = tuple((n, tuple(t.shape), t.dtype, t.requires_grad)
                    for n, t in list(mod._parameters.items()) + list(mod._buffers.items()) if t is not None)
    return (type(mod), tuple(attrs), tensors)


def tensors_in(x: Any) -> list[torch.Tensor]:
    """The tensors inside an argument structure."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in tensors_in(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in tensors_in(y)]
    return []


class MetaSpec:
    """A stored meta tensor: shape, strides, offset, dtype and the size of its storage (a view keeps
    its base's), enough to make an equal one."""

    __slots__ = ("shape", "stride", "offset", "dtype", "nbytes", "view", "grad")

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.stride, self.offset, self.dtype = tuple(t.shape), t.stride(), t.storage_offset(), t.dtype
        self.nbytes, self.view, self.grad = t.untyped_storage().nbytes(), t._is_view(), t.requires_grad

    def make(self) -> torch.Tensor:
        if not self.view and self.offset == 0:
            out = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")
            if out.untyped_storage().nbytes() != self.nbytes:
                out = self._on_base()
        else:
            out = self._on_base()
        return out.requires_grad_() if self.grad else out

    def _on_base(self) -> torch.Tensor:
        base = torch.empty(self.nbytes // self.dtype.itemsize, dtype=self.dtype, device="meta")
        return base.as_strided(self.shape, self.stride, self.offset)


def store(result: Any, inputs: list[torch.Tensor]) -> Any:
    """What to keep of a call's answer: meta tensors become specs (alone, or in a plain tuple or
    list), plain values stay; NOT_MEMOISED when some part cannot be remade exactly or is one of the
    call's own inputs (the node's meta would then be its input's object)."""
    if isinstance(result, torch.Tensor):
        if type(result) is not torch.Tensor or result.device.type != "meta" or any(result is t for t in inputs) \
                or result.untyped_storage().nbytes() % result.dtype.itemsize:
            return NOT_MEMOISED
        return MetaSpec(result)
    if type(result) in (tuple, list):
        parts = [store(r, inputs) for r in result]
        return NOT_MEMOISED if any(p is NOT_MEMOISED for p in parts) else type(result)(parts)
    return result if isinstance(result, _PLAIN) or type(result) is torch.Size else NOT_MEMOISED


def fresh(stored: Any) -> Any:
    """New objects equal to a stored answer (new meta tensors of the same layout)."""
    if isinstance(stored, MetaSpec):
        return stored.make()
    if type(stored) in (tuple, list):
        return type(stored)(fresh(r) for r in stored)
    return stored
