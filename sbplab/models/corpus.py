"""Real models nobody here wrote, built from small configs (nothing is downloaded), for checking that
sbplab compiles and trains what users bring: transformers' GPT-2, Llama (grouped-query attention,
RoPE, RMSNorm, SwiGLU), BERT, ViT, ResNet (BatchNorm), Mixtral (top-2 MoE), each with its own forward
and its own loss (``labels=``), plus a nanoGPT-style model (SDPA ``is_causal``, fused QKV, tied
weights) and an LSTM classifier.

    model, inputs, loss_fn, target = corpus.build("llama")
    step = sl.compile(model, inputs, loss_fn=loss_fn, target=target, strategy=sl.presets.data_parallel(2))

transformers is needed for the transformers models (``pip install sbplab[test]``).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

TRANSFORMERS = ("gpt2", "llama", "bert", "vit", "resnet", "mixtral")
MODELS = (*TRANSFORMERS, "nanogpt", "lstm")


def strategies() -> dict[str, Callable[[], Any]]:
    """The strategies every corpus model is checked under, on at most 4 ranks: name -> a fresh Strategy."""
    from ..compiler.deduction import presets

    return {
        "dp": lambda: presets.data_parallel(2),
        "zero3": lambda: presets.zero(2),
        "tp": lambda: presets.tensor_parallel(2, vocab=True),  # embedding and output layer over the vocabulary too
        "dp_tp": lambda: presets.dp_tp((2, 2), vocab=True),
        "pipeline": lambda: presets.pipeline(2, 2),
    }


@dataclass
class Built:
    """A model with one batch: ``sl.compile(model, inputs, loss_fn=loss_fn, target=target)``."""

    name: str
    model: nn.Module
    inputs: Any  # a dict of keyword inputs, or a tuple of positional ones
    loss_fn: Callable | None = None
    target: torch.Tensor | None = None

    def feeds(self) -> Any:
        """The batch as ``cluster.run`` and ``step.feeds`` take it: the inputs, then the target."""
        if isinstance(self.inputs, dict):
            return dict(self.inputs)
        return (*self.inputs, *([self.target] if self.target is not None else []))

    def torch_loss(self, model: nn.Module | None = None, rows: slice = slice(None)) -> torch.Tensor:
        """The loss plain torch computes on ``rows`` of the batch (the reference a parallel run must equal)."""
        m = model or self.model
        if isinstance(self.inputs, dict):
            out = m(**{k: v[rows] for k, v in self.inputs.items()})
        else:
            out = m(*(x[rows] for x in self.inputs))
        if self.loss_fn is not None:
            return self.loss_fn(out, self.target[rows])
        return out.loss if hasattr(out, "loss") else out[1]

    def train_torch(self, steps: int, make_optimizer: Callable, micro_batches: int = 1) -> tuple[list[float], nn.Module]:
        """Plain single-device torch on a copy of the model: ``steps`` steps, each the mean loss over
        ``micro_batches`` slices of the batch with gradients accumulated (what a pipeline computes);
        returns the losses and the trained copy."""
        m = copy.deepcopy(self.model)
        opt = make_optimizer(m.parameters())
        n = _batch_size(self.inputs)
        per = n // micro_batches
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            total = 0.0
            for k in range(micro_batches):
                loss = self.torch_loss(m, slice(k * per, (k + 1) * per)) / micro_batches
                loss.backward()
                total += float(loss.detach())
            opt.step()
            losses.append(total)
        return losses, m


def _batch_size(inputs: Any) -> int:
    first = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs[0]
    return int(first.shape[0])


def build(name: str, batch: int = 4, seq: int = 16, attn: str = "sdpa", seed: int = 0) -> Built:
    """Model ``name`` (one of ``MODELS``) with a batch of ``batch``; ``attn`` the transformers attention
    implementation ("sdpa" or "eager")."""
    if name not in MODELS:
        raise ValueError(f"unknown corpus model {name!r}; choose one of {MODELS}")
    torch.manual_seed(seed)
    if name in TRANSFORMERS:
        return _transformers(name, batch, seq, attn)
    if name == "nanogpt":
        m = NanoGPT(vocab=128, block=seq, n_layer=2, n_head=4, n_embd=64)
        x, y = torch.randint(0, 128, (batch, seq)), torch.randint(0, 128, (batch, seq))
        return Built(name, m.train(), (x, y))
    m = LSTMClassifier()
    x = torch.randint(0, 100, (batch, seq))
    y = torch.randint(0, 4, (batch,))
    return Built(name, m.train(), (x,), F.cross_entropy, y)


def _transformers(name: str, batch: int, seq: int, attn: str) -> Built:
    import transformers as tf

    small = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    vocab = 128
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=64, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model = tf.GPT2LMHeadModel
    elif name == "llama":
        cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=64,
                             bos_token_id=0, eos_token_id=0, pad_token_id=0)
        model = tf.LlamaForCausalLM
    elif name == "mixtral":
        cfg = tf.MixtralConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=64, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=vocab, num_local_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        model = tf.MixtralForCausalLM
    elif name == "bert":
        cfg = tf.BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            vocab_size=vocab, max_position_embeddings=64, num_labels=3, **small)
        x = torch.randint(0, vocab, (batch, seq))
        m = _make(tf.BertForSequenceClassification, cfg, attn)
        return Built(name, m, {"input_ids": x, "labels": torch.randint(0, 3, (batch,))})
    elif name == "vit":
        cfg = tf.ViTConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                           image_size=16, patch_size=4, num_channels=3, num_labels=5, **small)
        m = _make(tf.ViTForImageClassification, cfg, attn)
        return Built(name, m, {"pixel_values": torch.randn(batch, 3, 16, 16), "labels": torch.randint(0, 5, (batch,))})
    else:  # resnet
        cfg = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5,
                              layer_type="basic")
        m = tf.ResNetForImageClassification(cfg).train()
        return Built(name, m, {"pixel_values": torch.randn(batch, 3, 32, 32), "labels": torch.randint(0, 5, (batch,))})
    x = torch.randint(0, vocab, (batch, seq))
    return Built(name, _make(model, cfg, attn), {"input_ids": x, "labels": x})


def _make(cls: Any, cfg: Any, attn: str) -> nn.Module:
    cfg._attn_implementation = attn
    return cls(cfg).train()


class NanoGPT(nn.Module):
    """nanoGPT's shape: fused QKV (``c_attn``), SDPA with ``is_causal``, GELU MLP, tied embedding."""

    def __init__(self, vocab: int, block: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(NanoBlock(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as nanoGPT does

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class NanoBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)  # (B, T, C) each
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class LSTMClassifier(nn.Module):
    """Embedding, a 1-layer LSTM, the last hidden state to 4 classes."""

    def __init__(self, vocab: int = 100, dim: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(x))  # (B, T, dim)
        return self.head(out[:, -1])


RANDOM_OPS = {"aten.native_dropout.default", "aten.bernoulli.p", "aten.rand_like.default", "aten.randn_like.default",
              "aten.empty_like.default", "aten.empty.memory_format", "aten.new_empty.default"}


def op_instances(batch: int = 4, seq: int = 8) -> list[tuple[str, tuple, dict, str]]:
    """(op, input metas, attrs, model) for every distinct ATen op instance the corpus captures, random
    and uninitialised-memory ops left out: what the rule tests walk."""
    from ..compiler.training.training_graph import aten_training_graph

    seen, out = set(), []
    for name in MODELS:
        b = build(name, batch=batch, seq=seq)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = aten_training_graph(b.model, b.inputs, b.loss_fn, b.target)
        for op in g.ops:
            if "." not in op.type or op.type in RANDOM_OPS:
                continue
            metas = tuple(g.tensors[t].meta for t in op.inputs)
            key = (op.type, metas, tuple(sorted(op.attrs.items(), key=lambda kv: kv[0])))
            if key not in seen:
                seen.add(key)
                out.append((op.type, metas, dict(op.attrs), name))
    return out
