"""Wide & Deep: a recommender with one large embedding table shared by all categorical fields.

Wide part: a per-id weight of each class, summed over the fields (a linear model on one-hot ids).
Deep part: the fields' embeddings, flattened and joined with the dense features, through an MLP.
The large table is the natural place for a vocabulary split (embedding ``S(0)`` -> ``P``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class WideDeepConfig:
    vocab_size: int = 256  # ids over all categorical fields (fields are offset into one table)
    n_fields: int = 4  # categorical fields per example
    emb_dim: int = 8  # embedding width of the deep part
    n_dense: int = 6  # dense (real-valued) features
    hidden: int = 32  # width of the deep MLP
    n_classes: int = 2  # click / no click

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.n_fields, self.emb_dim, self.n_dense, self.hidden, self.n_classes) < 1:
            raise ValueError(f"WideDeepConfig sizes must be >= 1, got {self}")


class WideDeep(nn.Module):
    def __init__(self, cfg: WideDeepConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wide = nn.Embedding(cfg.vocab_size, cfg.n_classes)
        self.emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
        self.fc1 = nn.Linear(cfg.n_fields * cfg.emb_dim + cfg.n_dense, cfg.hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:  # (N, F) int, (N, n_dense)
        wide = self.wide(ids).sum(dim=1)  # (N, n_classes)
        e = self.emb(ids).flatten(1)  # (N, F * emb_dim)
        deep = self.fc2(self.act(self.fc1(torch.cat([e, dense], dim=1))))
        return wide + deep

    def example_batch(self, batch: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.cfg.vocab_size, (batch, self.cfg.n_fields), generator=g)
        dense = torch.randn(batch, self.cfg.n_dense, generator=g)
        return (ids, dense), torch.randint(0, self.cfg.n_classes, (batch,), generator=g)

    loss_fn = staticmethod(F.cross_entropy)
