"""MLP: an input projection, residual blocks of fc1 -> activation -> fc2, and a classifier head.

The block is the Megatron MLP: fc1 column-parallel, fc2 row-parallel, one all-reduce forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class MLPConfig:
    in_dim: int = 16  # input features
    width: int = 32  # residual stream width
    hidden: int = 64  # inner width of each block (4x width in transformers)
    n_blocks: int = 2  # residual blocks
    n_classes: int = 8  # logits of the classifier head
    activation: str = "relu"  # "relu" | "gelu" | "tanh"

    def __post_init__(self) -> None:
        if min(self.in_dim, self.width, self.hidden, self.n_classes) < 1 or self.n_blocks < 0:
            raise ValueError(f"MLPConfig sizes must be >= 1 (n_blocks >= 0), got {self}")
        if self.activation not in ("relu", "gelu", "tanh"):
            raise ValueError(f"activation must be relu, gelu or tanh, got {self.activation!r}")


class MLPBlock(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.hidden)
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "tanh": nn.Tanh()}[cfg.activation]
        self.fc2 = nn.Linear(cfg.hidden, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, width)
        return x + self.fc2(self.act(self.fc1(x)))


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.proj_in = nn.Linear(cfg.in_dim, cfg.width)
        self.blocks = nn.ModuleList(MLPBlock(cfg) for _ in range(cfg.n_blocks))
        self.head = nn.Linear(cfg.width, cfg.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, in_dim) -> (N, n_classes)
        h = self.proj_in(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)

    def example_batch(self, batch: int = 8, seed: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, self.cfg.in_dim, generator=g)
        return (x,), torch.randint(0, self.cfg.n_classes, (batch,), generator=g)

    loss_fn = staticmethod(F.cross_entropy)
