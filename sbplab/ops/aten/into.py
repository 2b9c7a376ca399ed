"""ATen ops that can write their one output into a given tensor: a gradient straight into its bucket.

DDP's ``gradient_as_bucket_view``: a gradient whose producer can write into a view of the all-reduce's
flat buffer needs no copy into it (``compiler/lowering/bucket_views.py``). A parameter's gradient from
torch's autograd is most often a matmul (a linear layer's weight) or a sum over the batch (its bias);
their ``out=`` overloads write the same bits the plain kernel returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..registry import IntoFn
from .calls import fill

OUT_OVERLOADS = {"aten.mm.default": "mm.out", "aten.bmm.default": "bmm.out", "aten.addmm.default": "addmm.out",
                 "aten.sum.dim_IntList": "sum.IntList_out"}


def into_kernel(name: str) -> IntoFn | None:
    """``kernel_into`` of ATen op ``name`` (its ``out=`` overload), or None where it has none here."""
    out_name = OUT_OVERLOADS.get(name)
    if out_name is None:
        return None
    op, overload = out_name.split(".")
    fn = getattr(getattr(torch.ops.aten, op), overload)

    def into(xs: Sequence[torch.Tensor], attrs: dict, out: torch.Tensor) -> None:
        args = fill(attrs["args"], list(xs), out.device)
        kwargs = dict(fill(attrs.get("kwargs", ()), list(xs), out.device))
        fn(*args, **kwargs, out=out)

    return into
