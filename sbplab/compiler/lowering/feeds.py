"""What a user hands a compiled step, checked and named: one batch, or one per step.

A compiled step is traced on one micro-batch, so its graph inputs have the micro-batch's shape; a
step takes M of them stacked along dim 0 (the batch dim). Nothing downstream can tell a batch of
the wrong size from a right one (the runtime cuts whatever it gets into M pieces and trains on
them, reporting a loss that is simply different), so every input is checked here, by name,
against the shape and dtype the step was compiled for.

Accepted, for a graph with inputs ``(idx, target)``:
- ``(idx, targets)`` or ``[idx, targets]``: in the order of ``graph.inputs`` (the module's example
  inputs, then the target, as ``sl.compile`` took them);
- ``{"idx": idx, "target": targets}``: by name;
- ``x``: the tensor itself, when the graph has one input;
- a list of any of those, one per step, or a function ``step -> batch``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...errors import InputTypeError
from ...ops.registry import TensorMeta
from ...runtime.results import Batches
from ..ir import Graph, GraphError
from .index_bounds import IndexBound, check_index_values, index_bounds

Batch = dict[str, torch.Tensor]


def expected_inputs(graph: Graph) -> dict[str, TensorMeta]:
    """Per graph input, the global shape and dtype of one step's batch (M micro-batches on dim 0)."""
    m = graph.micro_batches
    out = {}
    for name in graph.inputs:
        meta = graph.tensors[name].meta
        shape = (meta.shape[0] * m, *meta.shape[1:]) if meta.shape else meta.shape
        out[name] = TensorMeta(shape, meta.dtype)
    return out


def step_feeds(graph: Graph, inputs: Any) -> Batches:
    """``inputs`` as the runtime's batches (name -> global tensor), every tensor checked.

    One batch gives one mapping (used for every step); a list of batches or a function of the
    step gives the same, per step.
    """
    want, bounds = expected_inputs(graph), index_bounds(graph)
    if callable(inputs) and not isinstance(inputs, torch.Tensor):
        fn = inputs
        return lambda step: one_batch(want, fn(step), f"the batch of step {step}: ", bounds)
    if _is_per_step(inputs):
        return [one_batch(want, b, f"the batch of step {i}: ", bounds) for i, b in enumerate(inputs)]
    return one_batch(want, inputs, bounds=bounds)


def _is_per_step(inputs: Any) -> bool:
    """A list/tuple of batches (mappings or sequences), as opposed to one batch's tensors; a mix is
    read as one batch, whose check then names the input that is not a tensor."""
    return isinstance(inputs, (list, tuple)) and bool(inputs) and all(
        isinstance(b, (Mapping, list, tuple)) for b in inputs)


def one_batch(want: Mapping[str, TensorMeta], batch: Any, where: str = "",
              bounds: Mapping[str, IndexBound] | None = None) -> Batch:
    """One step's batch as name -> tensor, in any accepted form, each tensor checked against ``want``
    (and, for the inputs a step indexes with, against ``bounds``)."""
    names = list(want)
    takes = _takes(want)
    if batch is None:
        if names:
            raise GraphError(f"{where}no inputs given; the compiled step takes {takes}")
        return {}
    if isinstance(batch, torch.Tensor):
        if len(names) != 1:
            raise GraphError(f"{where}one tensor given, but the compiled step takes {len(names)} inputs: {takes}; "
                             f"give them as a tuple in this order or as a dict by name")
        batch = {names[0]: batch}
    elif isinstance(batch, Mapping):
        unknown = [k for k in batch if k not in want]
        if unknown:
            k = unknown[0]
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise GraphError(f"{where}unknown input {k!r}{hint}; the compiled step takes {takes}")
        missing = [n for n in names if n not in batch]
        if missing:
            raise GraphError(f"{where}input {missing[0]!r} is missing (given: {', '.join(map(repr, batch)) or 'none'});"
                             f" the compiled step takes {takes}")
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        if len(batch) != len(names):
            raise GraphError(f"{where}{len(batch)} input(s) given, but the compiled step takes {len(names)}: "
                             f"{takes}, in this order")
        batch = dict(zip(names, batch))
    else:
        raise InputTypeError(f"{where}inputs must be a tensor, a tuple of tensors in the order {names} or a dict by "
                             f"name; got {type(batch).__name__}")
    out = {n: _checked(n, batch[n], want[n], where) for n in names}
    for n, bound in (bounds or {}).items():
        check_index_values(n, out[n], bound, where)
    return out


def _checked(name: str, t: Any, want: TensorMeta, where: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InputTypeError(f"{where}input {name!r} must be a torch.Tensor of shape {want.shape} and dtype "
                             f"{want.dtype}; got {type(t).__name__}")
    if tuple(t.shape) != want.shape:
        batch = "" if not want.shape or t.dim() != len(want.shape) or tuple(t.shape[1:]) != want.shape[1:] else \
            f" (a batch of {t.shape[0]} where the step was compiled for {want.shape[0]})"
        raise GraphError(f"{where}input {name!r} has shape {tuple(t.shape)}{batch}; the compiled step takes "
                         f"{want.shape}")
    if t.dtype != want.dtype:
        raise GraphError(f"{where}input {name!r} has dtype {t.dtype}; the compiled step takes {want.dtype}")
    return t


def _takes(want: Mapping[str, TensorMeta]) -> str:
    return ", ".join(f"{n} {m.shape} {str(m.dtype).removeprefix('torch.')}" for n, m in want.items()) or "no inputs"

