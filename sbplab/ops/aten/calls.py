"""Calling an ATen op from a graph node: the op by name, its arguments as a template with tensor slots.

A captured node such as ``aten.addmm.default(bias, x, w, beta=1)`` becomes a registry op named
``"aten.addmm.default"`` whose inputs are the graph tensors (``bias, x, w``) and whose attrs hold the
rest of the call as a template: ``args=(Slot(0), Slot(1), Slot(2))``, ``kwargs=(("beta", 1),)``.
The template is hashable (attrs are frozen) and pickles into an actor plan, so a worker rebuilds the
call from the op's name alone: no user code travels.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from ..registry import UnknownOpError

# nodes a captured graph drops (shape checks) and nodes that only rename their input (the same tensor)
SKIPPED = frozenset({"aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
                     "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg"})
ALIASES = frozenset({"aten.detach.default", "aten.alias.default", "aten.lift_fresh_copy.default"})


def passed_through(name: str, node: Any, env: dict) -> bool:
    """True when ATen node ``node`` (op ``name``) needs no op of its own: a dropped check stands for
    nothing in ``env``, an alias for the tensor it renames."""
    if name in SKIPPED:
        env[node] = None
        return True
    if name in ALIASES:
        env[node] = env[node.args[0]]
        return True
    return False


def op_name(target: torch._ops.OpOverload) -> str:
    """``aten.mm.default``: the name rules, plans and errors know an ATen overload by."""
    return f"{target.namespace}.{target._opname}.{target._overloadname}"


@dataclass(frozen=True)
class Slot:
    """Where the ``index``-th tensor input goes in an op's argument template."""

    index: int


@dataclass(frozen=True)
class DeviceSlot:
    """A factory op's ``device=``: the device of the process that runs the kernel (meta when inferring)."""


def unknown_aten_op(name: str, lib: str | None = None) -> UnknownOpError:
    """The error for a name that does not resolve to an operator overload of ``torch.ops``."""
    where = f" (not even after importing {lib!r}, the module that defined it)" if lib else ""
    return UnknownOpError(f"no op named {name!r}: torch.ops has no such overload{where}")


@cache
def overload(name: str) -> torch._ops.OpOverload:
    """``"aten.mm.default"`` -> ``torch.ops.aten.mm.default``; a library namespace (``transformers``)
    is imported first, since importing the library is what registers its custom ops."""
    parts = name.split(".")
    if len(parts) != 3:
        raise unknown_aten_op(name)
    ns, op, ov = parts
    for attempt in range(2):
        try:
            return getattr(getattr(getattr(torch.ops, ns), op), ov)
        except (AttributeError, RuntimeError):
            if attempt or ns in ("aten", "prims"):
                break
            try:
                importlib.import_module(ns)
            except ImportError:
                break
    raise unknown_aten_op(name)


def resolve(name: str, lib: str | None = None) -> torch._ops.OpOverload:
    """``overload(name)``, importing ``lib`` first when that is what registers it (a worker process has
    not imported the module that defines a library's custom op: the captured call names it)."""
    try:
        return overload(name)
    except UnknownOpError:
        if not lib:
            raise
        try:
            importlib.import_module(lib)
            return overload(name)
        except (ImportError, UnknownOpError):
            raise unknown_aten_op(name, lib) from None


def library_of(name: str) -> str | None:
    """The Python module that registered custom op ``name`` (``transformers.integrations.moe`` for
    ``transformers.grouped_mm_fallback.default``), or None for ATen and unknown ops."""
    ns, op, _ = name.split(".")
    if ns in ("aten", "prims"):
        return None
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(f"{ns}::{op}")
    fn = getattr(opdef, "_init_fn", None)
    return getattr(fn, "__module__", None)


def fill(template: Any, tensors: list, device: Any) -> Any:
    """The template with each ``Slot`` replaced by its tensor and ``DeviceSlot`` by ``device``."""
    if isinstance(template, Slot):
        return tensors[template.index]
    if isinstance(template, DeviceSlot):
        return device
    if isinstance(template, tuple):
        return tuple(fill(x, tensors, device) for x in template)
    return template


def call(name: str, attrs: dict, tensors: list, device: Any = None) -> tuple:
    """Run the op on ``tensors`` with its template; always a tuple of tensors (None outputs kept)."""
    fn = resolve(attrs.get("op", name), attrs.get("lib"))  # a rule's localize may swap the overload (arange)
    args = fill(attrs["args"], tensors, device)
    kwargs = dict(fill(attrs.get("kwargs", ()), tensors, device))
    if "stream" in attrs:  # a random op of a compiled step: drawn from its own stream (family_random.py)
        from .family_random import run_random

        drawn = run_random(name, attrs, args)
        if drawn is not None:
            return drawn
    out = fn(*args, **kwargs)
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)

