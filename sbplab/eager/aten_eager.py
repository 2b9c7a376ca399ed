"""Eager ops as the ATen calls torch makes for them, so a lone op is decided by the same family rule
as a compiled one (``sbplab/ops/aten/rules.py``: one home per rule).

``x @ w`` on 2-D tensors is ``aten.mm``, as in a captured graph; ``x.mean(0)`` is ``aten.sum`` then
``aten.div`` by the global count, as the capture decomposes it (``ops/aten/decompositions.py``), so a mean over a
split dim is a partial sum kept partial by the division. A call that torch runs as several ATen ops
(a mean, a matmul of an N-D tensor by a matrix: view, mm, view) is several eager ops; a forced
signature or output SBP applies to its main op (the ``mm``, the ``sum``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ops.aten.calls import Slot
from ..ops.registry import TensorMeta
from ..ops.signature_text import SignatureError


@dataclass(frozen=True)
class AtenStep:
    """One ATen call of an eager op: ``args`` with ``Slot(i)`` for the i-th tensor so far (the eager
    op's inputs, then each earlier step's output); ``main`` is the step a forced signature applies to."""

    op: str
    args: tuple
    kwargs: tuple = ()
    main: bool = False


def _one(op: str, *args, kwargs: tuple = ()) -> list[AtenStep]:
    return [AtenStep(op, args, kwargs, main=True)]


def _matmul(metas: list[TensorMeta]) -> list[AtenStep]:
    a, b = metas[0].shape, metas[1].shape
    if len(a) == 2 and len(b) == 2:
        return _one("aten.mm.default", Slot(0), Slot(1))
    if len(b) == 2 and len(a) > 2:  # torch: (..., m, k) viewed as (M, k), mm, viewed back (_unsafe_view)
        lead = a[:-1]
        return [AtenStep("aten.view.default", (Slot(0), (math.prod(lead), a[-1]))),
                AtenStep("aten.mm.default", (Slot(2), Slot(1)), main=True),
                AtenStep("aten._unsafe_view.default", (Slot(3), (*lead, b[-1])))]
    return _one("aten.matmul.default", Slot(0), Slot(1))


METHODS = ("matmul", "add", "sub", "mul", "div", "neg", "relu", "tanh", "exp", "gelu", "sum", "mean", "max",
           "softmax", "log_softmax", "reshape", "view", "transpose", "permute", "slice")


def steps_of(name: str, metas: list[TensorMeta], attrs: dict) -> list[AtenStep] | None:
    """The ATen calls of eager op ``name`` on tensors ``metas``; None for a name that is not one of the
    global tensor's methods (``METHODS``; the other names ``sl.apply`` takes are traced from torch:
    ``torch_calls.py``)."""
    x = Slot(0)
    if name == "matmul":
        return _matmul(metas)
    if name in ("add", "sub", "mul", "div"):
        return _one(f"aten.{name}.Tensor", x, Slot(1))
    if name in ("neg", "relu", "tanh", "exp"):
        return _one(f"aten.{name}.default", x)
    if name == "gelu":
        return _one("aten.gelu.default", x, kwargs=(("approximate", attrs.get("approximate", "none")),))
    if name == "sum":
        return _one("aten.sum.dim_IntList", x, list(attrs["dims"]), bool(attrs.get("keepdim", False)))
    if name == "mean":
        dims = list(attrs["dims"])
        count = math.prod(metas[0].shape[d] for d in dims) if metas[0].shape else 1
        return [AtenStep("aten.sum.dim_IntList", (x, dims, bool(attrs.get("keepdim", False))), main=True),
                AtenStep("aten.div.Scalar", (Slot(1), count))]
    if name == "max":
        return _one("aten.amax.default", x, [attrs["dim"]], bool(attrs.get("keepdim", False)))
    if name in ("softmax", "log_softmax"):
        return _one(f"aten._{name}.default", x, attrs["dim"], False)
    if name in ("reshape", "view"):
        return _one("aten.view.default", x, tuple(attrs["shape"]))
    if name == "transpose":
        return _one("aten.transpose.int", x, attrs["dim0"], attrs["dim1"])
    if name == "permute":
        return _one("aten.permute.default", x, list(attrs["dims"]))
    if name == "slice":
        return _one("aten.slice.Tensor", x, attrs["dim"], attrs["start"], attrs["stop"], attrs["step"])
    return None


def renumber(template, order: list[int]):
    """``template`` with each ``Slot(i)`` renumbered to its position among the tensors one step reads
    (``order`` collects them, first use first)."""
    if isinstance(template, Slot):
        if template.index not in order:
            order.append(template.index)
        return Slot(order.index(template.index))
    if isinstance(template, (tuple, list)):
        return type(template)(renumber(t, order) for t in template)
    return template


def check_forced(name: str, steps: list[AtenStep], signature) -> None:
    """A forced signature names the main ATen op's tensors; a matmul of an N-D tensor forces its 2-D
    ``mm``, whose tensors the user never sees, so it is refused there (an output SBP still works)."""
    if signature is not None and name == "matmul" and len(steps) > 1:
        raise SignatureError(name, f"{name}: a forced signature needs 2-D operands (this matmul runs as view, mm, "
                                   f"view); force the output SBP with sbp=... instead")
