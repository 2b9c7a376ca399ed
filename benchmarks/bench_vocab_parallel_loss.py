"""The cross entropy on vocabulary shards against the logits gathered for it (Megatron's vocab-parallel
cross entropy vs ``gather_output``), on a GPT-2 of growing vocabulary under tensor parallel x2: bytes one
training step sends (all ranks, from the compiled plan) and the largest activation a rank holds.

    python benchmarks/bench_vocab_parallel_loss.py

Both steps split the output layer by vocabulary; the gathered one captures torch's own loss (as a strategy
that keeps the vocabulary whole does), so its logits are all-gathered before it. Figures are the plan's
(exact bytes), not timings.
"""

from __future__ import annotations

import warnings

import torch
import transformers as tf

import sbplab as sl
from sbplab.compiler.api import compile_training_graph
from sbplab.compiler.frontend.vocab_cross_entropy import sharded_loss
from sbplab.compiler.training.training_graph import trace_training_graph


def _step(vocab: int, sharded: bool):
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=vocab, n_positions=128, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    model = tf.GPT2LMHeadModel(cfg).train()
    x = torch.randint(0, vocab, (4, 128))
    strategy = sl.Strategy(sl.mesh(tp=2), [sl.TensorParallel("tp", vocab=True)])
    opt = sl.SGD(lr=0.1)
    with warnings.catch_warnings(), sharded_loss(sharded):
        warnings.simplefilter("ignore")
        g = trace_training_graph(model, {"input_ids": x, "labels": x}, None, None, 1, opt, capture="aten")
        return compile_training_graph(g, strategy, None)


def main() -> None:
    print(f"{'vocab':>7} {'sent, logits gathered':>22} {'sent, loss on shards':>21} {'ratio':>6}  "
          f"{'all-gathers (gathered / shards)':>32}")
    for vocab in (4096, 16384, 50256):
        sent, gathers = {}, {}
        for sharded in (False, True):
            step = _step(vocab, sharded)
            sent[sharded] = sum(sum(c.bytes_sent.values()) for c in step.physical.collectives)
            gathers[sharded] = sum(c.kind == "all_gather" for c in step.physical.collectives)
        print(f"{vocab:>7} {sent[False] / 2**20:>20.2f}MB {sent[True] / 2**20:>19.2f}MB "
              f"{sent[False] / max(sent[True], 1):>6.2f}  {gathers[False]:>16} / {gathers[True]}")


if __name__ == "__main__":
    main()
