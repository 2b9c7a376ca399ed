"""Optimizer updates as registry ops, so parameters, gradients and optimizer state all get SBPs.

An update is elementwise over (param, grad, state...), so its signatures are "everything split the
same way" or "everything broadcast". It is not linear in the gradient, so a ``P`` gradient must be
reduced first: to ``B`` by an all-reduce (data parallel) or to ``S(0)`` by a reduce-scatter (ZeRO,
where the state is stored ``S(0)`` too). The step counter of Adam is a broadcast scalar tensor.
The formulas follow torch.optim's single-tensor code, so results agree to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sbp import B
from .opkit import check_arity, check_same_shape, define, ew_flops, meta_like, same_split
from .registry import OpDef, Signature, TensorMeta


def _update_infer(name: str, n_tensors: int, n_out: int, scalar_tail: int = 0):
    def infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
        check_arity(name, ins, n_tensors + scalar_tail)
        for m in ins[1:n_tensors]:
            check_same_shape(name, ins[0], m, "param, grad and state")
        for m in ins[n_tensors:]:
            if m.shape != ():
                raise ValueError(f"{name}: the step counter must be a scalar, got shape {m.shape}")
        return [meta_like(ins[0]) for _ in range(n_out)]
    return infer


def _update_sigs(n_tensors: int, n_out: int, scalar_tail: int = 0):
    def sigs(ins: Sequence[TensorMeta], a: dict) -> list[Signature]:
        out = []
        for s in same_split(n_tensors, n_out, range(len(ins[0].shape))):
            out.append(Signature(s.inputs + (B,) * scalar_tail, s.outputs))
        return out
    return sigs


# SGD is written as torch.optim's single-tensor code writes it (``add`` with ``alpha``): the same bits,
# and one pass over the parameter with one new tensor, not two (a temporary for ``lr * d``).
def _sgd(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor]:
    p, g = xs
    d = torch.add(g, p, alpha=a["weight_decay"]) if a.get("weight_decay") else g
    return (torch.add(p, d, alpha=-a["lr"]),)


SGD = define(OpDef(
    "sgd_update", _update_infer("sgd_update", 2, 1), _update_sigs(2, 1), _sgd, ew_flops(3),
    doc="p - lr * (g + weight_decay * p).",
))


def _sgd_momentum(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor, torch.Tensor]:
    p, g, buf = xs
    d = torch.add(g, p, alpha=a["weight_decay"]) if a.get("weight_decay") else g
    buf = buf * a["momentum"] + d  # dampening 0: the first step gives buf = d, as torch does
    d = torch.add(d, buf, alpha=a["momentum"]) if a.get("nesterov") else buf
    return torch.add(p, d, alpha=-a["lr"]), buf


SGD_MOMENTUM = define(OpDef(
    "sgd_momentum_update", _update_infer("sgd_momentum_update", 3, 2), _update_sigs(3, 2), _sgd_momentum,
    ew_flops(6),
    doc="torch.optim.SGD with momentum (dampening 0): buf = momentum * buf + g; p -= lr * buf.",
))


def _adam(xs: Sequence[torch.Tensor], a: dict) -> tuple[torch.Tensor, ...]:
    p, g, m, v, t = xs
    g = g.to(p.dtype)  # a gradient kept in lower precision (sl.Precision(grad="bf16")) updates in p's
    lr, b1, b2, wd = a["lr"], a["beta1"], a["beta2"], a.get("weight_decay", 0.0)
    if wd and a.get("decoupled"):
        p = p * (1 - lr * wd)
    elif wd:
        g = g + wd * p
    m = m.lerp(g, 1 - b1)
    v = v * b2 + (1 - b2) * g * g
    step = float(t.item())
    bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
    denom = v.sqrt() / (bc2 ** 0.5) + a["eps"]
    return p - (lr / bc1) * (m / denom), m, v


ADAM = define(OpDef(
    "adam_update", _update_infer("adam_update", 4, 3, scalar_tail=1), _update_sigs(4, 3, scalar_tail=1),
    _adam, ew_flops(12),
    doc="torch.optim.Adam / AdamW (decoupled=True): inputs p, g, exp_avg, exp_avg_sq, step (after "
        "increment); outputs p, exp_avg, exp_avg_sq.",
))


def _count_infer(ins: Sequence[TensorMeta], a: dict) -> list[TensorMeta]:
    check_arity("step_count", ins, 1)
    if ins[0].shape != ():
        raise ValueError(f"step_count: the counter must be a scalar, got shape {ins[0].shape}")
    return [meta_like(ins[0])]


STEP_COUNT = define(OpDef(
    "step_count", _count_infer, lambda ins, a: [], lambda xs, a: (xs[0] + 1,), ew_flops(1),
    doc="The optimizer's step counter, t + 1; a broadcast scalar.",
))
