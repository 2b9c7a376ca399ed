"""Numeric precision and activation recomputation: two strategy options that trade memory and speed.

``Precision`` is the AMP / Megatron layout: parameters kept (and updated) in ``master`` precision,
a copy cast to ``compute`` precision feeds the forward and backward, gradients are reduced in
``grad`` precision and the optimizer's state is kept in ``optim_state`` precision. The default,
``Precision()``, is plain fp32 everywhere: what a model gets without asking.

``recompute`` says which activations the backward recomputes instead of keeping from the forward:
``"none"`` keeps them all, ``"full"`` keeps only each layer's input and reruns the layer's forward
in its backward (Megatron's full recomputation, ``torch.utils.checkpoint`` per layer), and
``"selective"`` recomputes only the cheap, large ones (attention's softmax and dropout, Megatron-LM
v3's selective recomputation).

How the compiled step executes them: ``compiler/training/precision_pass.py`` (the step captured under
``torch.autocast``; fp16 is refused, as it needs loss scaling) and ``compiler/training/recompute.py``
(forward ops cloned into the backward; random ops such as dropout stay saved rather than recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import InputError

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RECOMPUTE = ("none", "full", "selective")


@dataclass(frozen=True)
class Precision:
    """Which dtype each kind of tensor of a training step is kept in (names from ``DTYPES``)."""

    compute: str = "fp32"  # activations, and the parameter copy the forward and backward read
    master: str = "fp32"  # the parameters the optimizer updates
    grad: str = "fp32"  # gradients as reduced across ranks
    optim_state: str = "fp32"  # Adam's moments, momentum buffers

    def __post_init__(self) -> None:
        for name in ("compute", "master", "grad", "optim_state"):
            value = getattr(self, name)
            if value not in DTYPES:
                raise InputError(f"Precision.{name} must be one of {sorted(DTYPES)}, got {value!r}")

    @classmethod
    def mixed(cls, compute: str = "bf16") -> Precision:
        """Mixed precision as AMP and Megatron run it: ``compute`` math, fp32 master weights, grads and states."""
        return cls(compute=compute)

    @property
    def is_mixed(self) -> bool:
        return self.compute != self.master

    def bytes_of(self, kind: str) -> int:
        """Bytes per element of ``kind`` ("compute", "master", "grad" or "optim_state")."""
        return DTYPES[getattr(self, kind)].itemsize


def check_recompute(value: str) -> str:
    if value not in RECOMPUTE:
        raise InputError(f"Strategy.recompute must be one of {', '.join(map(repr, RECOMPUTE))}, got {value!r}")
    return value
