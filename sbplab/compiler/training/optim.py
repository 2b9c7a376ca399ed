"""Optimizers as graph ops: the update and the optimizer state are tensors of the training graph.

Keeping the state in the graph is what lets a strategy shard it (ZeRO stores ``exp_avg`` as
``S(0)``) and what lets the memory report count it per device. Each state tensor has an initial
value and a successor tensor (``graph.state_updates``) that replaces it after every step, exactly
as a parameter is replaced by its updated value. Names follow torch.optim's state keys.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import InputError, InputTypeError
from ..ir import Graph, GraphError


def _number(who: str, name: str, v: Any) -> float:
    """``v`` as a finite float, else a clear error naming the hyperparameter (nan and inf included:
    either one turns every parameter into nan at the first update)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InputTypeError(f"{who}: {name} must be a number, got {v!r} ({type(v).__name__})")
    if not math.isfinite(v):
        raise InputError(f"{who}: {name} must be a finite number, got {v}; a nan or infinite hyperparameter "
                         f"makes every parameter nan at the first update")
    return float(v)


def _state(graph: Graph, param: str, key: str) -> str:
    """A zero-initialised state tensor shaped like ``param`` (torch.optim starts from zeros too)."""
    t = graph.tensors[param]
    shape = t.shape
    name = f"{param}.{key}"
    graph.add_tensor(name, shape, "state", t.meta.dtype, init="zeros", module=t.module)
    return name


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD: lr, momentum (buffer ``momentum_buffer``), weight decay, Nesterov."""

    lr: float = 1e-2
    momentum: float = 0.0  # 0 means no momentum buffer at all
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        lr, momentum, wd = (_number("SGD", n, getattr(self, n)) for n in ("lr", "momentum", "weight_decay"))
        if not isinstance(self.nesterov, bool):
            raise InputTypeError(f"SGD: nesterov must be True or False, got {self.nesterov!r}")
        if lr <= 0 or momentum < 0 or wd < 0:
            raise InputError(f"SGD needs lr > 0, momentum >= 0, weight_decay >= 0; got {self}")
        if self.nesterov and momentum == 0:
            raise InputError("SGD(nesterov=True) needs momentum > 0, as torch.optim.SGD does")

    def build(self, graph: Graph) -> None:
        for p, g in graph.grads.items():
            module = graph.tensors[p].module
            if self.momentum == 0:
                op = graph.add_op("sgd_update", [p, g], {"lr": self.lr, "weight_decay": self.weight_decay},
                                  phase="update", module=module, out_names=[f"{p}.next"], role="state")
                graph.state_updates[p] = op.outputs[0]
                continue
            buf = _state(graph, p, "momentum_buffer")
            attrs = {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay,
                     "nesterov": self.nesterov}
            op = graph.add_op("sgd_momentum_update", [p, g, buf], attrs, phase="update", module=module,
                              out_names=[f"{p}.next", f"{buf}.next"], role="state")
            graph.state_updates[p], graph.state_updates[buf] = op.outputs

    def torch(self, params) -> torch.optim.Optimizer:
        """The same optimizer in torch.optim, for checking."""
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
                               nesterov=self.nesterov)


@dataclass(frozen=True)
class Adam:
    """torch.optim.Adam (``decoupled=True``: AdamW); state ``exp_avg``, ``exp_avg_sq`` and a step count."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def __post_init__(self) -> None:
        lr, eps, wd = (_number("Adam", n, getattr(self, n)) for n in ("lr", "eps", "weight_decay"))
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise InputTypeError(f"Adam: betas must be a pair (beta1, beta2), got {self.betas!r}")
        b1, b2 = (_number("Adam", f"betas[{i}]", b) for i, b in enumerate(self.betas))
        if not isinstance(self.decoupled, bool):
            raise InputTypeError(f"Adam: decoupled must be True or False, got {self.decoupled!r}")
        if lr <= 0 or not (0 <= b1 < 1 and 0 <= b2 < 1) or eps <= 0 or wd < 0:
            raise InputError(f"Adam needs lr > 0, betas in [0, 1), eps > 0, weight_decay >= 0; got {self}")

    def build(self, graph: Graph) -> None:
        if "adam.step" in graph.tensors:
            raise GraphError("the graph already has an optimizer")
        graph.add_tensor("adam.step", (), "state", torch.float32, init="zeros")
        t = graph.add_op("step_count", ["adam.step"], {}, phase="update", out_names=["adam.step.next"],
                         role="state").outputs[0]
        graph.state_updates["adam.step"] = t
        attrs = {"lr": self.lr, "beta1": self.betas[0], "beta2": self.betas[1], "eps": self.eps,
                 "weight_decay": self.weight_decay, "decoupled": self.decoupled}
        for p, g in graph.grads.items():
            m, v = _state(graph, p, "exp_avg"), _state(graph, p, "exp_avg_sq")
            op = graph.add_op("adam_update", [p, g, m, v, t], attrs, phase="update",
                              module=graph.tensors[p].module,
                              out_names=[f"{p}.next", f"{m}.next", f"{v}.next"], role="state")
            for old, new in zip((p, m, v), op.outputs):
                graph.state_updates[old] = new

    def torch(self, params) -> torch.optim.Optimizer:
        cls = torch.optim.AdamW if self.decoupled else torch.optim.Adam
        return cls(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)


def AdamW(lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 1e-2) -> Adam:
    """torch.optim.AdamW: Adam with decoupled weight decay."""
    return Adam(lr, betas, eps, weight_decay, decoupled=True)


_BY_NAME = {"sgd": "sl.SGD(lr=0.01)", "adam": "sl.Adam(lr=0.001)", "adamw": "sl.AdamW(lr=0.001)"}


def _equivalent(opt: torch.optim.Optimizer) -> str:
    """The sbplab optimizer with the hyperparameters of a torch.optim one (its first group's)."""
    g = opt.param_groups[0] if opt.param_groups else {}
    name = type(opt).__name__
    if name == "SGD":
        kw = [f"lr={g.get('lr', 1e-3)!r}"] + [f"{k}={g[k]!r}" for k in ("momentum", "weight_decay")
                                               if g.get(k)] + (["nesterov=True"] if g.get("nesterov") else [])
        return f"sl.SGD({', '.join(kw)})"
    if name in ("Adam", "AdamW"):
        kw = [f"lr={g.get('lr', 1e-3)!r}"]
        if tuple(g.get("betas", (0.9, 0.999))) != (0.9, 0.999):
            kw.append(f"betas={tuple(g['betas'])!r}")
        if g.get("eps", 1e-8) != 1e-8:
            kw.append(f"eps={g['eps']!r}")
        if g.get("weight_decay") and not (name == "AdamW" and g["weight_decay"] == 1e-2):
            kw.append(f"weight_decay={g['weight_decay']!r}")
        return f"sl.{name}({', '.join(kw)})"
    return "sl.SGD(lr=...) or sl.Adam(lr=...)"


def as_optimizer(optimizer: Any) -> Any:
    """The optimizer a training step is compiled with: an sbplab optimizer as it is, None as the default
    ``SGD()``; anything else (a ``torch.optim`` optimizer or its class, a name like ``"sgd"``) is refused
    with the sbplab optimizer to write instead. sbplab's optimizers are graph ops, so their state can be
    sharded like any tensor: a torch.optim object, which updates tensors in place, cannot be used."""
    if optimizer is None:
        return SGD()
    if isinstance(optimizer, (SGD, Adam)):
        return optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        raise InputTypeError(f"optimizer=torch.optim.{type(optimizer).__name__}(...) is a torch.optim "
                             f"optimizer; sbplab compiles its own optimizer into the step (its state is sharded "
                             f"like any tensor): use {_equivalent(optimizer)}")
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        name = optimizer.__name__
        sub = {"SGD": "sl.SGD(lr=...)", "Adam": "sl.Adam(lr=...)", "AdamW": "sl.AdamW(lr=...)"}
        raise InputTypeError(f"optimizer=torch.optim.{name} is a torch.optim class; sbplab compiles its own "
                             f"optimizer into the step: use {sub.get(name, 'sl.SGD(lr=...) or sl.Adam(lr=...)')}")
    if isinstance(optimizer, str):
        sub = _BY_NAME.get(optimizer.strip().lower())
        raise InputTypeError(f"optimizer={optimizer!r} is a name; give an sbplab optimizer object: "
                             + (f"{sub} (with your learning rate)" if sub else
                                "sl.SGD(lr=...), sl.Adam(lr=...) or sl.AdamW(lr=...)"))
    if callable(getattr(optimizer, "build", None)):  # a graph optimizer of one's own (build(graph) adds the update)
        return optimizer
    raise InputTypeError(f"optimizer must be an sbplab optimizer (sl.SGD(lr=...), sl.Adam(lr=...), sl.AdamW(lr=...)), "
                         f"got {type(optimizer).__name__}")
