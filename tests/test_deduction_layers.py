"""Identical layers deduced once: an op of a repeated layer that asks the question its twin one layer
earlier asked takes the twin's ranking (``deduction/layers.py``). The deduction is the one that ranks
every op: on transformers' GPT-2 and Llama (five layers, meta device) under data x tensor parallel,
ZeRO and a pipeline, every op's signature, reason and runners-up, every tensor's SBP and every boxing
are equal, and most layer ops did take their twin's ranking (so the shortcut is what is tested)."""

from __future__ import annotations

import warnings

import pytest
from tiny_hf import tiny_hf_training_graph

import sbplab as sl
from sbplab.compiler.deduction.caches import clear_caches
from sbplab.compiler.deduction.deduce import deduce
from sbplab.compiler.deduction.layers import every_layer_ranked

tf = pytest.importorskip("transformers")
LAYERS = 5


STRATEGIES = {
    "dp_tp": lambda: sl.presets.dp_tp((2, 2)),
    "zero": lambda: sl.presets.zero(4),
    "pipeline": lambda: sl.presets.pipeline(2, micro_batches=1, ranks_per_stage=(2, 2), inner="dp_tp"),
}


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def graph(request):
    """The training graph of a five-layer model (the vocabulary-sharded loss, as dp_tp compiles it)."""
    return tiny_hf_training_graph(request.param, LAYERS)


def _record(d) -> tuple:
    choices = {k: (c.signature, c.cost, tuple(c.reads), c.reason, tuple(c.rejected)) for k, c in d.choices.items()}
    boxings = [(b.id, b.tensor, b.kind, b.src_sbp, b.dst_sbp, b.src_placement, b.dst_placement, b.plan, b.phase,
                b.stage, b.reason, tuple(b.consumers), b.source) for b in d.boxings]
    return choices, boxings, d.sbp, d.produced, d.placement, d.store_boxing, d.write_backs


@pytest.mark.parametrize("preset", list(STRATEGIES))
def test_layers_deduced_once_equal_every_layer_ranked(graph, preset):
    g, strategy = graph, STRATEGIES[preset]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TensorParallelWarning: the head's amax stays whole
        clear_caches()  # each deduction answers its own questions
        with every_layer_ranked():
            full = deduce(g, strategy)
        clear_caches()
        once = deduce(g, strategy)
    assert full.copied == 0 and not full.twins
    layer_ops = sum(1 for op in g.ops if ".layers." in op.module or ".h." in op.module)
    assert once.copied > layer_ops // 2  # most ops of layers 1..4 took their twin's ranking
    assert _record(once) == _record(full)
    assert len(once.boxings) > 0
