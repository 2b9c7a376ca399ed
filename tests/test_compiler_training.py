"""Ground truth before any process starts: every zoo model under every preset, on 1-D and 2-D CPU
meshes of up to 8 simulated ranks, trains for 3 steps to the same losses and parameters as
single-device PyTorch with torch.optim (float32 tolerance).

Adam runs with eps=1e-4: with torch's default 1e-8, an element whose gradient is ~1e-8 gets an
update of about lr * g / (|g| + eps), which amplifies float32 rounding in g (summation order
differs across shards) far beyond float32 tolerance, on a single device as much as on eight.
"""

from __future__ import annotations

import pytest

from sbplab.compiler import SGD, Adam, Strategy, presets
from sbplab.compiler.deduction.presets import as_mesh
from sbplab.compiler.reference import compare
from sbplab.models import CNN, GPT, MLP, CNNConfig, GPTConfig, MLPConfig, WideDeep, WideDeepConfig

TOL = 2e-5
ZOO = {
    "mlp": (MLP, MLPConfig(), 8),
    "gpt": (GPT, GPTConfig(n_layer=2), 8),
    "wide_deep": (WideDeep, WideDeepConfig(), 8),
    "cnn": (CNN, CNNConfig(), 8),
}
SGDM = SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
ADAM = Adam(lr=0.01, eps=1e-4)
PRESETS = {  # name -> (strategy factory, optimizer)
    "single": (lambda: Strategy(as_mesh(1), name="single device"), SGDM),
    "dp4": (lambda: presets.data_parallel(4), ADAM),
    "tp4": (lambda: presets.tensor_parallel(4), SGDM),
    "dp_tp_2x2": (lambda: presets.dp_tp((2, 2)), ADAM),
    "zero3_4": (lambda: presets.zero(4), ADAM),
    "zero2_4": (lambda: presets.zero(4, shard_params=False), SGDM),
    "pipe2x2": (lambda: presets.pipeline(2, 2), ADAM),
    "pipe2x2_dp2": (lambda: presets.pipeline(2, 2, 2, "dp"), SGDM),
}
SLOW = {  # 8 ranks and deeper combinations
    "dp8": (lambda: presets.data_parallel(8), SGDM),
    "dp_tp_2x4": (lambda: presets.dp_tp((2, 4)), ADAM),
    "dp_2x2_mesh": (lambda: presets.data_parallel((2, 2)), SGDM),
    "pipe4x2": (lambda: presets.pipeline(4, 2), SGDM),
    "pipe2x2_tp2": (lambda: presets.pipeline(2, 2, 2, "tp"), ADAM),
    "pipe2x2_zero2": (lambda: presets.pipeline(2, 2, 2, "zero"), ADAM),
    "pipe2x2_dp_tp_2x2": (lambda: presets.pipeline(2, 2, (2, 2), "dp_tp"), SGDM),
}


def _check(model_name: str, preset: tuple) -> None:
    cls, cfg, batch = ZOO[model_name]
    model = cls(cfg)
    xs, y = model.example_batch(batch)
    make, opt = preset
    r = compare(model, xs, target=y, loss_fn=model.loss_fn, optimizer=opt, strategy=make(), steps=3)
    assert r.loss_err < TOL, r
    assert r.max_param_err < TOL, r
    assert r.losses[2] < r.losses[0]  # it trains


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("model_name", list(ZOO))
def test_zoo_model_under_preset_equals_torch(model_name, preset):
    _check(model_name, PRESETS[preset])


@pytest.mark.slow
@pytest.mark.parametrize("preset", list(SLOW))
@pytest.mark.parametrize("model_name", list(ZOO))
def test_zoo_model_on_up_to_8_ranks_equals_torch(model_name, preset):
    _check(model_name, SLOW[preset])


def test_gradients_and_micro_batches_match_torch():
    """With 4 micro-batches, the accumulated gradient is the full batch's gradient."""
    import copy

    model = GPT(GPTConfig(n_layer=1))
    xs, y = model.example_batch(8)  # 4 micro-batches of 2, each split over 2 data-parallel ranks
    r = compare(model, xs, target=y, loss_fn=model.loss_fn, optimizer=SGD(lr=0.1), strategy=presets.pipeline(2, 4, 2, "dp"), steps=1)
    ref = copy.deepcopy(model)
    model.loss_fn(ref(*xs), y).backward()
    ex = r.compiled.executor()
    ex.step(dict(zip(r.compiled.graph.inputs, list(xs) + [y])))
    for n, p in ref.named_parameters():
        assert (ex.grad(n) - p.grad).abs().max().item() < TOL, n
    acc = [op for op in r.compiled.graph.ops if op.type == "acc"]
    assert len(acc) == len(r.compiled.graph.params) + 1  # every gradient, and the loss
