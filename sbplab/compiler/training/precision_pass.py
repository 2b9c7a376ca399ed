"""Mixed precision as the compiled step runs it: the AMP / Megatron layout of ``sl.Precision``.

The forward and backward are captured under ``torch.autocast`` (ATen capture): torch's own autocast
lists decide which ops run in the compute dtype (matmuls, convolutions, attention) and which stay in
fp32 (softmax with a loss, norms' statistics, reductions), and the casts it inserts become ops of
the graph, so the step is exactly what ``torch.autocast`` would run, op for op. The master
parameters stay in ``master`` precision and are cast to the compute dtype where an op reads them;
autograd sends their gradients back through the cast, in the master dtype. Then:

- ``grad``: each micro-batch's gradient is cast to the grad dtype before it is accumulated and
  reduced (a cast passes a partial sum, so the reduction itself runs in that dtype, as Megatron's
  ``grad_reduce_in_bf16``); the update reads it as it is and computes in the master dtype (no cast
  back in the graph: a cast would pass the partial sum on and the reduction would move after it);
- ``optim_state``: the optimizer's state (momentum, Adam's moments) is stored in that dtype; the
  update computes in the master dtype and stores the new state cast back.

fp16 compute is refused: fp16 gradients underflow without loss scaling, which sbplab does not
implement; bf16 has fp32's range and needs none.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ...errors import InputError
from ...ops.aten.calls import Slot
from ..deduction.precision import DTYPES, Precision
from ..ir import Graph, TensorMeta

CAST = "aten._to_copy.default"


def check_precision(precision: Precision) -> None:
    """Refuse what the runtime cannot execute faithfully, saying why and what works."""
    if "fp16" in (precision.compute, precision.master, precision.grad):
        raise InputError(f"{precision}: fp16 compute, weights or gradients need loss scaling (fp16 gradients "
                         f"underflow without it), which sbplab does not implement; use bf16 (fp32's range, no "
                         f"scaling): sl.Precision.mixed('bf16')")
    if precision.compute == "fp32" and precision.master != "fp32":
        raise InputError(f"{precision}: compute in fp32 from {precision.master} master weights gains nothing; "
                         f"keep the master weights at least as wide as the compute (master='fp32')")


def autocast_dtype(precision: Precision) -> torch.dtype | None:
    """The dtype the step is captured under ``torch.autocast`` with; None for fp32 compute."""
    return None if precision.compute == "fp32" else DTYPES[precision.compute]


def autocast(dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on the CPU (the capture runs on CPU fake tensors), or nothing."""
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def master_module(module: torch.nn.Module, precision: Precision) -> torch.nn.Module:
    """The module with its floating parameters in the master dtype (a copy when that changes them)."""
    dtype = DTYPES[precision.master]
    if all(p.dtype == dtype for p in module.parameters() if p.is_floating_point()):
        return module
    return copy.deepcopy(module).to(dtype)


def _cast(g: Graph, x: str, dtype: torch.dtype, phase: str, module: str, name: str, role: str = "activation") -> str:
    return g.add_op(CAST, [x], {"args": (Slot(0),), "kwargs": (("dtype", dtype),)}, phase=phase,
                    module=module, name=name, role=role).outputs[0]


def cast_gradients(g: Graph, grads: dict[str, str], precision: Precision) -> dict[str, str]:
    """Each micro-batch gradient in the grad dtype (before accumulation and reduction)."""
    dtype = DTYPES[precision.grad]
    out = {}
    for p, gr in grads.items():
        if g.tensors[gr].meta.dtype != dtype and g.tensors[gr].meta.dtype.is_floating_point:
            gr = _cast(g, gr, dtype, "backward", g.tensors[p].module, f"{p}.grad_cast")
        out[p] = gr
    return out


def cast_optimizer_states(g: Graph, precision: Precision, before: set[str]) -> None:
    """Optimizer states (made after ``before``, the tensors the graph had) stored in the state dtype:
    the update reads each one cast up to its parameter's dtype and stores the new value cast down."""
    dtype = DTYPES[precision.optim_state]
    for state, new in list(g.state_updates.items()):
        t = g.tensors[state]
        if state in before or t.role != "state" or t.shape == () or not t.meta.dtype.is_floating_point:
            continue
        if t.meta.dtype == dtype:
            continue
        wide = t.meta.dtype
        readers = g.consumers(state)
        t.meta = TensorMeta(t.meta.shape, dtype)
        up = g.add_op(CAST, [state], {"args": (Slot(0),), "kwargs": (("dtype", wide),)}, phase="update",
                      module=t.module, name=f"{state}.load")
        first = min(g.ops.index(r) for r in readers)
        g.ops.remove(up)
        g.ops.insert(first, up)
        for r in readers:
            for _ in range(r.inputs.count(state)):
                t.consumers.remove(r.name)
                g.tensors[up.outputs[0]].consumers.append(r.name)
            r.inputs = [up.outputs[0] if i == state else i for i in r.inputs]
        g.state_updates[state] = _cast(g, new, dtype, "update", t.module, f"{state}.store", role="state")
