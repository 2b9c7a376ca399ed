"""A 4-D matmul captured at ATen level stays 4-D, so tensor parallelism splits attention by heads.

torch decomposes ``q @ k.transpose(-2, -1)`` on (B, nh, T, hs) into a view merging (B, nh), a ``bmm`` and
a view back; a head split cannot cross the merge. ``unmerge_batched_matmuls`` turns each such bmm back
into one ``aten.matmul`` on the 4-D tensors (forward and backward), whose rule splits any batch dim.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sbplab as sl
from sbplab.compiler.reference import torch_steps

STEPS, LR = 3, 0.1


def _gpt():
    torch.manual_seed(0)
    model = sl.models.GPT(sl.models.GPTConfig(n_layer=2))
    (idx,), targets = model.example_batch(8)
    return model, idx, targets


def _tp_step(model, idx, targets):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        step = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets, optimizer=sl.SGD(lr=LR),
                          strategy=sl.presets.tensor_parallel(2), capture="aten")
    return step, [str(w.message) for w in seen if issubclass(w.category, sl.TensorParallelWarning)]


def test_the_captured_attention_keeps_its_heads_and_tensor_parallel_splits_them():
    model, idx, targets = _gpt()
    step, tp_warnings = _tp_step(model, idx, targets)
    types = [op.type for op in step.graph.ops]
    assert "aten.bmm.default" not in types  # every attention product is one 4-D matmul, forward and backward
    assert types.count("aten.matmul.default") == 2 * 2 * 3  # per layer: 2 forward products, 4 backward
    assert not any("attn" in w for w in tp_warnings), tp_warnings  # no attention layer is left whole
    for layer in (0, 1):
        for name in "qkv":  # column parallel: output features (heads) split
            assert step.deduction.sbp[f"blocks.{layer}.attn.{name}.weight"] == (sl.S(0),)
        assert step.deduction.sbp[f"blocks.{layer}.attn.proj.weight"] == (sl.S(1),)  # row parallel
    # Megatron's forward, by hand: one all-reduce after attention and one after the MLP, per layer; the
    # vocabulary-parallel embedding's (1) and cross entropy's row max and sum of exponentials (2)
    forward = [line.split() for line in step.summary().splitlines() if line.strip().startswith("forward ")]
    assert forward == [["forward", "all_reduce", "x7"]]


@pytest.mark.multiprocess
def test_the_head_split_step_trains_like_torch():
    model, idx, targets = _gpt()
    want, want_params = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=LR), steps=STEPS)
    step, _ = _tp_step(model, idx, targets)
    with sl.LocalCluster(2) as cluster:
        res = cluster.run(step, (idx, targets), steps=STEPS, progress=False)
    assert res.losses == pytest.approx(want, abs=2e-6)
    for name, p in want_params.items():
        assert torch.allclose(res.params[name].full(), p, atol=2e-6), name
