"""Tiny transformers GPT-2 and Llama on the meta device (built from configs, no download), for tests
whose point is the structure of a stack of identical layers, not its numbers."""

from __future__ import annotations

import pytest
import torch


def tiny_hf(kind: str, layers: int, **extra) -> torch.nn.Module:
    """A ``kind`` ("gpt2" or "llama") model of ``layers`` layers, 32 wide, in training mode; ``extra`` goes
    to GPT-2's config (dropouts are off unless it says otherwise)."""
    tf = pytest.importorskip("transformers")
    if kind == "gpt2":
        cfg = tf.GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, **extra)
        cls = tf.GPT2LMHeadModel
    else:
        cfg = tf.LlamaConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=64, max_position_embeddings=16, bos_token_id=0,
                             eos_token_id=0)
        cls = tf.LlamaForCausalLM
    with torch.device("meta"):
        return cls(cfg).train()


def tiny_hf_training_graph(kind: str, layers: int):
    """The ATen training graph (Adam) of ``tiny_hf(kind, layers)`` on a (4, 8) batch, with the loss on
    vocabulary shards as a dp_tp strategy compiles it."""
    import warnings

    import sbplab as sl
    from sbplab.compiler.frontend.vocab_cross_entropy import sharded_loss
    from sbplab.compiler.training.training_graph import aten_training_graph

    with torch.device("meta"):
        ids = torch.zeros(4, 8, dtype=torch.int64)
    with warnings.catch_warnings(), sharded_loss(True):
        warnings.simplefilter("ignore")
        return aten_training_graph(tiny_hf(kind, layers), {"input_ids": ids, "labels": ids}, None, None, 1,
                                   sl.Adam(lr=1e-3))
