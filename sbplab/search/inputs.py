"""What ``sl.search`` is given to trace: the model's inputs and target, checked before any work.

``inputs`` takes the forms ``sl.compile`` takes: one tensor, a tuple (or list) of positional tensors,
or a dict of keyword tensors (``{"input_ids": x, "labels": x}`` for a transformers model that computes
its own loss, ``loss_fn=None``). ``target`` is what ``loss_fn(output, target)`` takes: a tensor, a
tuple of tensors, or None. Every tensor is cut along dim 0 into micro-batches, so the batch the search
may divide is the greatest common divisor of their dim-0 sizes (1 when one is a scalar).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .search_errors import SearchError

_FORMS = ("a tensor, a tuple of tensors (the model's positional inputs) or a dict of tensors by keyword "
          "(its keyword inputs, e.g. {'input_ids': x, 'labels': x})")


@dataclass(frozen=True)
class SearchInputs:
    """The checked inputs: ``inputs`` a tuple of tensors or a dict of them, as ``sl.compile`` takes them."""

    inputs: tuple[torch.Tensor, ...] | dict[str, torch.Tensor]
    target: torch.Tensor | tuple[torch.Tensor, ...] | None

    @property
    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the batch: the inputs, then the target."""
        xs = list(self.inputs.values()) if isinstance(self.inputs, dict) else list(self.inputs)
        t = self.target
        return xs + ([] if t is None else [t] if isinstance(t, torch.Tensor) else list(t))

    @property
    def batch(self) -> int:
        """The largest batch every tensor divides into along dim 0 (1 if one has no dim 0)."""
        sizes = [int(t.shape[0]) if t.dim() else 0 for t in self.tensors]
        if not sizes or 0 in sizes:
            return 1
        return math.gcd(*sizes)

    def feeds(self) -> Any:
        """The batch as ``cluster.run`` takes it: by name for keyword inputs, else inputs then target."""
        if isinstance(self.inputs, dict):
            if self.target is None:
                return dict(self.inputs)
        return tuple(self.tensors)  # in the order of the step's graph inputs


def check_inputs(inputs: Any, target: Any, loss_fn: Any) -> SearchInputs:
    """``inputs``, ``target`` and ``loss_fn`` checked (a SearchError names what is wrong and what would do)."""
    if isinstance(inputs, torch.Tensor):
        xs: tuple | dict = (inputs,)
    elif isinstance(inputs, dict):
        if not inputs:
            raise SearchError(f"sl.search: inputs is an empty dict; give the model's inputs as {_FORMS}")
        for k, v in inputs.items():
            if not isinstance(k, str):
                raise SearchError(f"sl.search: the keys of an inputs dict are the model's keyword argument names "
                                  f"(strings), got {k!r} ({type(k).__name__})")
            if not isinstance(v, torch.Tensor):
                raise SearchError(f"sl.search: inputs[{k!r}] is {_what(v)}, not a torch.Tensor; every value of an "
                                  f"inputs dict must be a tensor with the batch on dim 0 (pass other options to the "
                                  f"model when you build it)")
        xs = dict(inputs)
    elif isinstance(inputs, (tuple, list)):
        if not inputs:
            raise SearchError(f"sl.search: inputs is empty; give the model's inputs as {_FORMS}")
        for k, v in enumerate(inputs):
            if not isinstance(v, torch.Tensor):
                raise SearchError(f"sl.search: inputs[{k}] is {_what(v)}, not a torch.Tensor; every positional "
                                  f"input must be a tensor with the batch on dim 0")
        xs = tuple(inputs)
    else:
        raise SearchError(f"sl.search: inputs must be {_FORMS}; got {_what(inputs)}")
    if target is not None and not isinstance(target, torch.Tensor):
        if not isinstance(target, (tuple, list)) or not target or \
                not all(isinstance(t, torch.Tensor) for t in target):
            raise SearchError(f"sl.search: target must be a tensor, a tuple of tensors (what loss_fn(output, target) "
                              f"takes) or None; got {_what(target)}")
        target = tuple(target)
    if loss_fn is not None and not callable(loss_fn):
        raise SearchError(f"sl.search: loss_fn must be a function loss_fn(output, target) -> scalar tensor, or None "
                          f"when the model returns its own loss; got {_what(loss_fn)}")
    return SearchInputs(xs, target)


def _what(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"a tensor of shape {tuple(v.shape)}"
    r = repr(v)
    return f"{type(v).__name__} {r if len(r) <= 40 else r[:37] + '...'}"

