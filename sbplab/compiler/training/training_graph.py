"""The training graph of one step: trace one micro-batch, add backward, add the optimizer update.

``compile`` and the strategy editor both build it this way; the editor keeps the result across
strategy edits (it does not depend on the SBP choices), so both call these functions and the
rules (batch must divide into micro-batches; the graph is traced on the first micro-batch) live here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...errors import SbplabError
from ..deduction.precision import Precision
from ..frontend.from_torch import from_torch
from ..ir import Graph, GraphError
from .autodiff import add_backward, attach_gradients
from .optim import as_optimizer
from .precision_pass import (
    autocast_dtype,
    cast_gradients,
    cast_optimizer_states,
    check_precision,
    master_module,
)


def as_tensor_tuple(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    """A module's example inputs as a tuple (one tensor is a tuple of one)."""
    return (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)


def first_micro_batch(tensors: Sequence[torch.Tensor], micro_batches: int) -> tuple[torch.Tensor, ...]:
    """The first 1/M of every tensor along dim 0 (the batch dim): what one micro-batch looks like.

    Every batch size must divide by M, so all micro-batches have the shape the graph is traced with.
    """
    m = micro_batches
    if m < 1:
        raise GraphError(f"micro_batches must be >= 1, got {m}")
    if m == 1:
        return tuple(tensors)
    for t in tensors:
        if t.dim() == 0:
            raise GraphError(f"a scalar example tensor has no batch dim to cut into {m} micro-batches")
        if t.shape[0] % m:
            raise GraphError(f"batch size {t.shape[0]} does not divide into {m} micro-batches "
                             f"(a tensor of shape {tuple(t.shape)})")
    return tuple(t[: t.shape[0] // m] for t in tensors)


def training_graph(forward: Graph, micro_batches: int = 1, optimizer: Any = None) -> Graph:
    """A copy of ``forward`` (traced on one micro-batch, ending in a loss) with backward, gradient
    accumulation over ``micro_batches`` and ``optimizer``'s update (SGD by default) added."""
    g = forward.copy()
    add_backward(g, micro_batches)
    as_optimizer(optimizer).build(g)
    return g


CAPTURES = ("auto", "aten", "fx")


def trace_training_graph(module: torch.nn.Module, example_inputs: Any, loss_fn: Callable | None,
                         target: torch.Tensor | None, micro_batches: int = 1, optimizer: Any = None,
                         *, full_batch_graph: Graph | None = None, capture: str = "auto",
                         precision: Precision | None = None, capture_fn: Callable | None = None) -> Graph:
    """Trace ``module`` on the first micro-batch of ``example_inputs``/``target`` (one full batch)
    and build its training graph.

    capture: "fx" traces with torch.fx onto sbplab's own op library (each op's backward traced from
        torch's autograd of its kernel: ``op_vjp``); "aten" captures forward and backward at ATen level with torch.export and
        torch's autograd (``aten_training_graph``: any model torch.export can trace); "auto" (default)
        takes "fx" where it maps the whole model and "aten" otherwise (and for keyword inputs).
    full_batch_graph: the module already traced on the whole batch, reused when there is one
        micro-batch (tracing again would give the same graph).
    precision: an ``sl.Precision`` other than plain fp32 is captured at ATen level under
        ``torch.autocast`` (``precision_pass``); capture="fx" refuses it.
    """
    if capture not in CAPTURES:
        raise GraphError(f"capture must be one of {CAPTURES}, got {capture!r}")
    if precision is not None and precision != Precision():
        check_precision(precision)
        if capture == "fx":
            raise GraphError(f"capture='fx' cannot run {precision}: mixed precision is captured at ATen level "
                             f"under torch.autocast; use capture='aten' or 'auto'")
        return aten_training_graph(module, example_inputs, loss_fn, target, micro_batches, optimizer, precision,
                                   capture_fn)
    if capture == "aten" or (capture == "auto" and isinstance(example_inputs, dict)):
        return aten_training_graph(module, example_inputs, loss_fn, target, micro_batches, optimizer,
                                   capture_fn=capture_fn)
    try:
        xs = as_tensor_tuple(example_inputs)
        tensors = first_micro_batch([*xs, *([target] if target is not None else [])], micro_batches)
        if full_batch_graph is not None and micro_batches == 1:
            forward = full_batch_graph
        else:
            forward = from_torch(module, tensors[: len(xs)], loss_fn,
                                 tensors[len(xs)] if target is not None else None)
        return training_graph(forward, micro_batches, optimizer)
    except Exception as fx_error:
        if isinstance(fx_error, GraphError) and "micro-batch" in str(fx_error):
            raise
        if capture == "fx":
            if isinstance(fx_error, SbplabError):
                raise
            raise GraphError(f"torch.fx could not trace {type(module).__name__}: {type(fx_error).__name__}: "
                             f"{fx_error}; capture='aten' captures any model torch.export can") from fx_error
        try:
            return aten_training_graph(module, example_inputs, loss_fn, target, micro_batches, optimizer,
                                       capture_fn=capture_fn)
        except GraphError as e:
            raise type(e)(f"{e}\n  (torch.fx tracing failed too: {type(fx_error).__name__}: "
                          f"{str(fx_error).splitlines()[0] if str(fx_error) else ''})") from e


def aten_training_graph(module: torch.nn.Module, example_inputs: Any, loss_fn: Callable | None,
                        target: Any, micro_batches: int = 1, optimizer: Any = None,
                        precision: Precision | None = None, capture_fn: Callable | None = None) -> Graph:
    """The training graph captured at ATen level (``aten_capture``): forward and backward from torch's
    autograd on the first micro-batch, gradients summed over ``micro_batches``, then ``optimizer``.

    example_inputs: a tensor, a tuple of positional inputs, or a dict of keyword inputs
        (``{"input_ids": x, "labels": y}`` for a transformers model that computes its own loss).
    target: what ``loss_fn(output, target)`` takes (a tensor or a tuple of them); None when the model
        returns its loss.
    precision: mixed precision (``precision_pass``): master weights, autocast compute, gradient and
        optimizer-state dtypes.
    capture_fn: called instead of ``capture_aten``, with its arguments (the search derives a micro-batch's
        capture from the whole batch's, ``search/rebatch.py``).
    """
    precision = precision or Precision()
    module = master_module(module, precision)
    from ..frontend.aten_capture import capture_aten

    kwargs = dict(example_inputs) if isinstance(example_inputs, dict) else {}
    args = () if kwargs else as_tensor_tuple(example_inputs)
    targets = () if target is None else as_tensor_tuple(target)
    flat = first_micro_batch([*args, *kwargs.values(), *targets], micro_batches)
    n, k = len(args), len(kwargs)
    g, grads = (capture_fn or capture_aten)(module, flat[:n], dict(zip(kwargs, flat[n:n + k])), loss_fn,
                                            flat[n + k:], autocast=autocast_dtype(precision))
    from ...ops.aten.family_random import number_random_ops
    from ..frontend.aten_unmerge import unmerge_batched_matmuls

    unmerge_batched_matmuls(g, protected=set(grads.values()))  # attention's heads stay a dim of their own
    number_random_ops(g)  # each dropout its own stream: the same masks in every strategy
    seed = g.op_by_name["loss.seed"]
    seed.attrs = {**seed.attrs, "value": 1.0 / micro_batches}  # d(mean over micro-batches)/d(loss)
    attach_gradients(g, cast_gradients(g, grads, precision), micro_batches)
    if micro_batches > 1:
        _buffer_updates_per_step(g, micro_batches)
    before = set(g.tensors)
    as_optimizer(optimizer).build(g)
    cast_optimizer_states(g, precision, before)
    return g


def _buffer_updates_per_step(g: Graph, micro_batches: int) -> None:
    """A buffer a forward updates (BatchNorm's running statistics) is replaced once per step, by the
    mean of its micro-batches' new values. (torch with gradient accumulation updates it once per
    micro-batch; the two differ in the running statistics only, never in the losses or gradients.)"""
    for state, new in list(g.state_updates.items()):
        node = g.add_op("acc", [new], {"scale": 1.0 / micro_batches}, phase="backward", role="state",
                        out_names=[g.fresh_name(f"{state}.next")], module=g.tensors[state].module)
        g.state_updates[state] = node.outputs[0]
