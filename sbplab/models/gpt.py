"""GPT: a nanoGPT-style decoder-only transformer (pre-norm blocks, causal self-attention, GELU MLP).

Attention keeps separate q, k, v projections so that a column split of each splits whole heads
(Megatron), and writes the causal mask as an added constant (-1e9 above the diagonal),
which is softmax-equivalent to masked_fill with -inf. Mask and positions are made in ``forward`` from
constants (no buffers; the mask once, shared by every layer), so a meta-device model still traces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 64  # tokens
    block_size: int = 16  # longest sequence (size of the position table and the mask)
    n_layer: int = 2  # transformer blocks
    n_head: int = 4  # attention heads; must divide n_embd
    n_embd: int = 32  # residual stream width
    mlp_ratio: int = 4  # MLP inner width = mlp_ratio * n_embd
    bias: bool = True  # biases in Linear layers (LayerNorms always have them)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head ({self.n_head}) must divide n_embd ({self.n_embd})")
        if min(self.vocab_size, self.block_size, self.n_head, self.n_embd, self.mlp_ratio) < 1 or self.n_layer < 0:
            raise ValueError(f"GPTConfig sizes must be >= 1 (n_layer >= 0), got {self}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.size()
        hs = C // self.n_head
        q = self.q(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k(x).view(B, T, self.n_head, hs).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        mask = causal_mask(T, x.device) if mask is None else mask  # 0 on and below the diagonal
        att = F.softmax(att + mask, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.proj(y)


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, bias=cfg.bias)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = FeedForward(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) int -> (B, T, vocab)
        B, T = idx.size()
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.cfg.block_size}")
        pos, mask = torch.arange(T, device=idx.device), causal_mask(T, idx.device)  # constants
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask)  # one (T, T) mask for every layer, not one per layer
        return self.lm_head(self.ln_f(x))

    def example_batch(self, batch: int = 4, seq: int | None = None, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        T = seq or self.cfg.block_size
        idx = torch.randint(0, self.cfg.vocab_size, (batch, T), generator=g)
        return (idx,), torch.randint(0, self.cfg.vocab_size, (batch, T), generator=g)

    @staticmethod
    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Next-token cross entropy over every position: (B, T, V) logits, (B, T) targets."""
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def causal_mask(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(T, T): 0 on and below the diagonal, -1e9 above it (added to attention scores before softmax)."""
    return torch.full((T, T), -1e9, device=device).triu(1)
