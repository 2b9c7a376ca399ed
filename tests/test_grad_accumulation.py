"""Gradient accumulation without pipelining: ``Strategy(micro_batches=M)`` with no stages runs forward and
backward M times per step on M slices of the batch, sums the gradients, and updates once; on real
workers under data parallel and ZeRO-3 it trains like torch accumulating ``loss / M`` over the same
slices. Also Megatron's configuration in small: accumulation with bf16 mixed precision and full
recomputation together.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import sbplab as sl
from sbplab.compiler.reference import torch_steps

pytestmark = pytest.mark.multiprocess
STEPS = 3
M = 2


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


def _mlp():
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=2, n_classes=4))
    (x,), y = m.example_batch(8)
    return m, x, y


@pytest.mark.parametrize("preset", ["dp", "zero3"])
def test_accumulation_on_workers_equals_torch(cluster, preset):
    model, x, y = _mlp()
    strategy = (sl.presets.data_parallel(2, micro_batches=M) if preset == "dp"
                else sl.presets.zero(2, micro_batches=M))
    assert strategy.stages is None
    opt = sl.Adam(lr=0.01)
    step = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=opt, strategy=strategy)
    assert step.graph.micro_batches == M and step.plan().micro_batches == M
    acc = [op for op in step.graph.ops if op.type == "acc" and op.outputs[0] in step.graph.grads.values()]
    assert len(acc) == len(step.graph.params)  # every gradient summed over the micro-batches
    result = cluster.run(step, (x, y), steps=STEPS, progress=False)
    want, want_params = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=opt, steps=STEPS, micro_batches=M)
    one_batch, _ = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=opt, steps=STEPS)
    assert result.losses == pytest.approx(want, rel=1e-5, abs=1e-6)
    for name, p in want_params.items():
        assert torch.allclose(result.params[name].full(), p, atol=1e-5), name
    fired = {e.micro for e in result.trace.select(rank=0, lane="compute") if e.phase == "forward" and e.micro >= 0}
    assert fired == set(range(M))  # the forward ran once per micro-batch
    # the micro-batches' mean loss equals the whole batch's (a mean of equal halves); training did not diverge
    assert want[0] == pytest.approx(one_batch[0], rel=1e-5)


def test_accumulation_with_bf16_and_full_recomputation(cluster):
    """Megatron's layout: micro-batches accumulated, bf16 compute from fp32 masters, each layer recomputed.
    Tolerance as in test_mixed_precision (bf16 rounding of gradients summed across ranks)."""
    torch.manual_seed(0)
    model = sl.models.GPT(sl.models.GPTConfig(n_layer=2))
    (idx,), targets = model.example_batch(8)
    prec = sl.Precision.mixed("bf16")
    strategy = dataclasses.replace(sl.presets.data_parallel(2, micro_batches=M), precision=prec, recompute="full")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
        step = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets, optimizer=sl.SGD(lr=0.1),
                          strategy=strategy)
    assert step.recompute.cloned > 0
    result = cluster.run(step, (idx, targets), steps=STEPS, progress=False)
    want, want_params = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS,
                                    precision=prec, micro_batches=M)
    assert result.losses == pytest.approx(want, abs=2e-3)
    for name, p in want_params.items():
        assert torch.allclose(result.params[name].full(), p, atol=2e-3, rtol=0), name
