"""Real models nobody here wrote (transformers GPT-2, Llama, BERT, ViT, ResNet, Mixtral; a nanoGPT-style
model; an LSTM) captured at ATen level and trained on real workers: every loss and every final
parameter equals plain single-device torch.

BatchNorm (ResNet) is synchronised: its statistics are sums over the whole batch, so data parallel,
ZeRO and DP x TP equal one device; with micro-batches (the pipeline) each micro-batch has its own
statistics, as gradient accumulation in torch gives, and the reference accumulates the same way.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sbplab as sl
from sbplab.models import corpus

pytest.importorskip("transformers")

STRATEGIES = {
    "dp": lambda: sl.presets.data_parallel(2),
    "zero3": lambda: sl.presets.zero(2),
    "dp_tp": lambda: sl.presets.dp_tp((2, 2)),
    "pipeline": lambda: sl.presets.pipeline(2, 2),
}
LR = 0.05


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(4) as c:
        yield c


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("name", corpus.MODELS)
def test_real_model_trains_like_torch(cluster, name, strategy):
    built = corpus.build(name)
    st = STRATEGIES[strategy]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)  # Mixtral's routing runs whole (tested below)
        step = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                          optimizer=sl.SGD(lr=LR, momentum=0.9), strategy=st)
    assert step.graph.micro_batches == st.micro_batches
    result = cluster.run(step, built.feeds(), steps=3)
    want, trained = built.train_torch(3, lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9), st.micro_batches)
    assert result.losses == pytest.approx(want, abs=2e-5), (result.losses, want)
    got = result.full_params()
    seen = set()
    for fqn, p in trained.named_parameters():  # tied weights appear once, under their first name
        if id(p) in seen:
            continue
        seen.add(id(p))
        torch.testing.assert_close(got[fqn], p.detach(), atol=2e-5, rtol=1e-4, msg=lambda m, fqn=fqn: f"{fqn}: {m}")
