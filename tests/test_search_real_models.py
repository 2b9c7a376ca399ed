"""``sl.simulate`` and ``sl.search`` on the real-model corpus (transformers GPT-2, Llama, BERT, ViT, ResNet,
Mixtral; nanoGPT; an LSTM) for 8 H100s, on their ATen-captured training steps.

The corpus models take keyword inputs (``{"input_ids": x, "labels": x}``) and compute their own loss, or
fall back from torch.fx to the ATen capture; the search traces them as ``sl.compile`` does, so the
strategy it returns compiles on the same graph and simulates to the time it predicted.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn

import sbplab as sl
from sbplab.models import corpus
from sbplab.search import SearchError
from sbplab.search.mesh import MeshChoice
from sbplab.search.presets_eval import applicable_presets, preset_choice
from sbplab.search.search_api import Space
from sbplab.search.to_strategy import strategy_for
from sbplab.sim import Prediction

pytest.importorskip("transformers")

H100 = sl.Hardware.h100_node()
BATCH = 16  # divides into 8 ranks, and a pipeline's 4 micro-batches into 4 ranks each


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Mixtral's routing runs replicated; transformers' own notices
        yield


def _compile(b: corpus.Built, strategy: sl.Strategy):
    return sl.compile(b.model, b.inputs, loss_fn=b.loss_fn, target=b.target, strategy=strategy)


def _check(pred, ranks: int = 8) -> None:
    assert isinstance(pred, Prediction)
    assert 0 < pred.step_time < math.inf
    assert len(pred.peak_memory) == ranks and all(v > 0 for v in pred.peak_memory.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", corpus.MODELS)
def test_every_corpus_model_simulates_under_data_parallel_on_8_h100(name):
    b = corpus.build(name, batch=BATCH)
    _check(sl.simulate(_compile(b, sl.presets.data_parallel(8)), H100))


@pytest.mark.slow
def test_zero_dp_tp_and_a_pipeline_simulate_on_8_h100():
    b = corpus.build("llama", batch=BATCH)
    for st in (sl.presets.zero(8), sl.presets.dp_tp((4, 2)), sl.presets.pipeline(2, 4, 4, inner="dp")):
        _check(sl.simulate(_compile(b, st), H100))


@pytest.mark.slow
@pytest.mark.parametrize("name,method,pipelines", [("gpt2", "cd", True), ("llama", "auto", False),
                                                    ("resnet", "cd", True)])
def test_search_on_8_h100_returns_a_strategy_that_compiles_and_simulates_as_predicted(name, method, pipelines):
    b = corpus.build(name, batch=BATCH)
    res = sl.search(b.model, b.inputs, loss_fn=b.loss_fn, target=b.target, devices=8, hardware=H100,
                    method=method, time_budget=120, rerank_top=1, pipelines=pipelines)  # re-rank included
    assert isinstance(res.strategy, sl.Strategy)
    assert res.predicted.source == "simulator"
    step = _compile(b, res.strategy)  # traced again, on the real tensors: the graph the search priced
    pred = sl.simulate(step, res.hardware)
    _check(pred)
    assert pred.step_time == pytest.approx(res.predicted.step_time, rel=1e-6)
    simulated_presets = [p.simulated_time for p in res.presets if p.simulated_time is not None]
    assert simulated_presets and pred.step_time <= min(simulated_presets) * (1 + 1e-9)


@pytest.mark.slow
def test_a_searched_candidate_compiles_to_what_its_preset_twin_compiles_to():
    """A candidate with data parallel's forward signatures, made a Strategy as the search makes one (a
    signature per forward op, backward ops pinned where every input layout is known), compiles to data
    parallel's step op for op. (On an ATen graph most backward ops read tensors only autograd's formulas
    make; pinned to the first signature that fits the inputs they know, they were replicated.)"""
    b = corpus.build("llama", batch=64, seq=32)
    space = Space(b.model, b.inputs, b.loss_fn, b.target, None, H100)
    spec = next(s for s in applicable_presets(8, space.batch) if s.name == "data parallel x8")
    pc = preset_choice(space.graph(1), spec, H100)
    pr = space.problem(MeshChoice((8,), (0,)))
    twin = strategy_for(pr, pr.assignment(pc.signatures), 0, "data parallel's twin")
    got, want = _compile(b, twin), _compile(b, sl.presets.data_parallel(8))
    differ = [op.name for op in got.graph.ops
              if got.deduction.choices[op.name].signature != want.deduction.choices[op.name].signature]
    assert not differ, differ
    assert sl.simulate(got, H100).step_time == pytest.approx(sl.simulate(want, H100).step_time)


def test_micro_batches_slice_every_keyword_input():
    b = corpus.build("bert", batch=BATCH)
    space = Space(b.model, b.inputs, b.loss_fn, b.target, None, H100)
    assert space.batch == BATCH
    g = space.graph(4)
    assert g.micro_batches == 4
    shapes = {n: g.tensors[n].shape for n in g.inputs}
    assert shapes == {"input_ids": (BATCH // 4, 16), "labels": (BATCH // 4,)}, shapes


class _NoLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return {"logits": self.fc(x)}


X = torch.randn(8, 4)


@pytest.mark.parametrize("inputs,target,loss_fn,match", [
    ({"x": [1, 2, 3]}, None, None, r"inputs\['x'\] is list .*not a torch.Tensor"),
    ({0: X}, None, None, r"keys of an inputs dict .* got 0"),
    ({}, None, None, "empty dict"),
    ((), None, None, "inputs is empty"),
    ((X, 3), None, None, r"inputs\[1\] is int 3, not a torch.Tensor"),
    ("x", None, None, "inputs must be a tensor, a tuple of tensors .* or a dict"),
    ((X,), "y", nn.functional.mse_loss, "target must be a tensor, a tuple of tensors"),
    ((X,), X, "mse", "loss_fn must be a function"),
])
def test_bad_inputs_are_clear_search_errors_before_any_tracing(inputs, target, loss_fn, match):
    with pytest.raises(SearchError, match=match):
        sl.search(nn.Linear(4, 4), inputs, loss_fn=loss_fn, target=target, devices=2)


def test_a_bad_capture_and_a_model_without_a_loss_are_search_errors():
    with pytest.raises(SearchError, match="capture must be one of"):
        sl.search(_NoLoss(), {"x": X}, devices=2, capture="jit")
    with pytest.raises(SearchError, match="(?s)cannot be compiled.*with no loss"):
        sl.search(_NoLoss(), {"x": X}, devices=2)
