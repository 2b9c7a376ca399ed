"""A small CNN classifier: two 3x3 convolutions, global average pooling, a linear head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class CNNConfig:
    in_channels: int = 3  # image channels
    image_size: int = 8  # height = width of the input
    channels: tuple[int, int] = (8, 16)  # output channels of conv1 and conv2
    n_classes: int = 10  # logits of the head

    def __post_init__(self) -> None:
        if min(self.in_channels, self.image_size, *self.channels, self.n_classes) < 1:
            raise ValueError(f"CNNConfig sizes must be >= 1, got {self}")


class CNN(nn.Module):
    def __init__(self, cfg: CNNConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c1, c2 = cfg.channels
        self.conv1 = nn.Conv2d(cfg.in_channels, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, stride=2, padding=1)
        self.head = nn.Linear(c2, cfg.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W) -> (N, n_classes)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.head(x.mean(dim=(2, 3)))  # global average pool

    def example_batch(self, batch: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        s = self.cfg.image_size
        x = torch.randn(batch, self.cfg.in_channels, s, s, generator=g)
        return (x,), torch.randint(0, self.cfg.n_classes, (batch,), generator=g)

    loss_fn = staticmethod(F.cross_entropy)
