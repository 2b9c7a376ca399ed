"""Tiny compiled training steps (zoo GPT and MLP) shared by the schedule tests: small enough to compile in
well under a second, with the layer count and heads that give their strategies several groups and stages."""

from __future__ import annotations

import torch

from sbplab.compiler import compile
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig


def tiny_gpt_step(strategy, optimizer, heads: int = 2):
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=heads, n_embd=16))
    x = torch.randint(0, 32, (8, 8))  # (B, T)
    return compile(m, (x,), loss_fn=GPT.loss_fn, target=x, optimizer=optimizer, strategy=strategy)


def tiny_mlp_step(strategy, optimizer, batch: int):
    m = MLP(MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=3, n_classes=4))
    x, y = torch.randn(batch, 8), torch.randint(0, 4, (batch,))
    return compile(m, (x,), loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=optimizer, strategy=strategy)
