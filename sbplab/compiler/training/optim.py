"""Optimizers as graph ops: the update and the optimizer state are tensors of the training graph.

Keeping the state in the graph is what lets a strategy shard it (ZeRO stores ``exp_avg`` as
``S(0)``) and what lets the memory report count it per device. Each state tensor has an initial
value and a successor tensor (``graph.state_updates``) that replaces it after every step, exactly
as a parameter is replaced by its updated value. Names follow torch.optim's state keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir import Graph, GraphError


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
        if self.lr <= 0 or self.momentum < 0 or self.weight_decay < 0:
            raise ValueError(f"SGD needs lr > 0, momentum >= 0, weight_decay >= 0; got {self}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("SGD(nesterov=True) needs momentum > 0, as torch.optim.SGD does")

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
        b1, b2 = self.betas
        if self.lr <= 0 or not (0 <= b1 < 1 and 0 <= b2 < 1) or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"Adam needs lr > 0, betas in [0, 1), eps > 0, weight_decay >= 0; got {self}")

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
