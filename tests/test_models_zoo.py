"""The model zoo: plain torch modules with validated configs, example batches and losses."""

from __future__ import annotations

import pytest
import torch

from sbplab.models import CNN, GPT, MLP, CNNConfig, GPTConfig, MLPConfig, WideDeep, WideDeepConfig


def test_forward_shapes_and_losses():
    m = MLP(MLPConfig(in_dim=5, width=12, hidden=20, n_blocks=3, n_classes=4, activation="tanh"))
    (x,), y = m.example_batch(6)
    assert m(x).shape == (6, 4) and len(m.blocks) == 3 and y.shape == (6,)
    g = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=8))
    (idx,), t = g.example_batch(3, seq=5)
    assert g(idx).shape == (3, 5, 20)
    assert g.loss_fn(g(idx), t).shape == ()
    w = WideDeep(WideDeepConfig(vocab_size=50, n_fields=3, emb_dim=4, n_dense=2, hidden=8))
    (ids, dense), y = w.example_batch(5)
    assert w(ids, dense).shape == (5, 2) and int(ids.max()) < 50
    c = CNN(CNNConfig(in_channels=1, image_size=6, channels=(2, 3), n_classes=5))
    (img,), y = c.example_batch(2)
    assert c(img).shape == (2, 5) and img.shape == (2, 1, 6, 6)


def test_gpt_attention_is_causal():
    torch.manual_seed(0)
    g = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8))
    a = torch.randint(0, 16, (1, 6))
    b = a.clone()
    b[0, 4:] = (b[0, 4:] + 1) % 16  # change only the future of position 3
    torch.testing.assert_close(g(a)[0, :4], g(b)[0, :4])
    assert not torch.allclose(g(a)[0, 4:], g(b)[0, 4:])


def test_gpt_builds_on_the_meta_device():
    with torch.device("meta"):
        g = GPT(GPTConfig(n_layer=1))
    assert all(p.is_meta for p in g.parameters()) and not list(g.buffers())


@pytest.mark.parametrize("bad,match", [
    (lambda: MLPConfig(width=0), "must be >= 1"),
    (lambda: MLPConfig(activation="swish"), "relu, gelu or tanh"),
    (lambda: GPTConfig(n_head=3, n_embd=32), "must divide n_embd"),
    (lambda: WideDeepConfig(n_fields=0), "must be >= 1"),
    (lambda: CNNConfig(channels=(4, 0)), "must be >= 1"),
])
def test_bad_configs_say_what_is_wrong(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_gpt_rejects_sequences_longer_than_its_block():
    g = GPT(GPTConfig(block_size=4, n_layer=0))
    with pytest.raises(ValueError, match="longer than block_size 4"):
        g(torch.zeros(1, 5, dtype=torch.int64))
