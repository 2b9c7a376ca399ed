"""Predicting another framework's run of a step (``sim/framework.py``): each difference from sbplab's
runtime is priced where it happens, by the amount it costs, and nothing else moves."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import sbplab as sl
from sbplab.sim.framework import MEGATRON_LM_2021, Framework
from sbplab.sim.step_pricing import _LAYER, _op_flops, pricing_of

A100 = sl.Machine.a100_cluster(1)


@pytest.fixture(scope="module")
def step():
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(vocab_size=512, block_size=128, n_layer=2, n_head=4, n_embd=256))
    (idx,), y = m.example_batch(8)
    st = replace(sl.presets.data_parallel(2), micro_batches=2, recompute="full")
    return sl.compile(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.Adam(lr=1e-3), strategy=st)


def _grad_reduce(plan, r):
    return {i for i, a in enumerate(plan.ranks[r].actors) if a.lane == "comm" and a.phase == "backward"
            and a.scope == "step"}


def test_gradient_reduction_after_the_backward_exposes_all_of_it(step):
    base = sl.simulate(step, A100, steps=3)
    after = sl.simulate(step, A100, steps=3, framework=Framework("serial", grad_reduce_after_backward=True))
    lo, hi = base.window_start, base.step_ends[-1]
    f, n = base.firings, base.steps - 1
    for r in base.classes:
        chosen = _grad_reduce(base.plan, r)
        assert chosen
        xfer = sum(min(f.end[j], hi) - max(f.xfer[j], lo) for j in range(len(f))
                   if f.rank[j] == r and f.node[j] in chosen and f.end[j] > lo and f.xfer[j] < hi) / n
        # every transfer second of the reduction is now exposed (the compute is unchanged)
        assert xfer > 0 and after.breakdown[r]["exposed communication"] >= xfer * (1 - 1e-6)
        assert base.breakdown[r]["exposed communication"] < xfer  # sbplab's runtime hides some of it
        assert after.breakdown[r]["compute"] == pytest.approx(base.breakdown[r]["compute"])
    hidden = after.step_time - base.step_time
    assert hidden >= 0
    assert after.step_time == pytest.approx(sum(after.breakdown[0].values()), rel=1e-6)


def test_optimizer_traffic_costs_its_bytes_at_the_device_bandwidth(step):
    per_param = 14.0
    base = sl.simulate(step, A100, steps=3)
    more = sl.simulate(step, A100, steps=3, framework=Framework("opt", optimizer_bytes_per_param=per_param))
    params = sum(p.numel() for p in step_params(step))
    dev = A100.device
    want = params * per_param / (dev.mem_bandwidth * dev.mem_efficiency)  # data parallel: every rank holds all
    assert more.step_time - base.step_time == pytest.approx(want, rel=0.05)


def step_params(step):
    g = step.graph
    return [torch.empty(g.tensors[p].shape, device="meta") for p in g.params]


def test_whole_layer_recomputation_reruns_the_ops_the_graph_left_out(step):
    pruned, whole = pricing_of(step), pricing_of(step, whole_layers=True)
    assert not pruned.recomputed and whole.recomputed  # the graph holds its clones; the rest is priced
    assert whole.recompute_flops > pruned.recompute_flops
    # a whole forward of every block again: with the clones' FLOPs, the blocks' forward FLOPs once more
    g = step.graph
    blocks = sum(_op_flops(g, op) for op in g.ops_in("forward") if _LAYER.match(op.module or ""))
    assert whole.recompute_flops == pytest.approx(blocks * g.micro_batches, rel=1e-9)
    a = sl.simulate(step, A100, steps=3)
    b = sl.simulate(step, A100, steps=3, framework=Framework("whole", recompute_whole_layer=True))
    assert b.step_time > a.step_time
    assert b.tflops_per_device(with_recompute=True) * b.step_time == pytest.approx(
        (whole.model_flops + whole.recompute_flops) / b.devices / 1e12, rel=1e-9)


def test_megatron_is_the_three_together(step):
    assert MEGATRON_LM_2021.recompute_whole_layer and MEGATRON_LM_2021.grad_reduce_after_backward
    m = sl.simulate(step, A100, steps=3, framework=MEGATRON_LM_2021)
    parts = [sl.simulate(step, A100, steps=3, framework=f).step_time for f in (
        Framework("w", recompute_whole_layer=True), Framework("g", grad_reduce_after_backward=True),
        Framework("o", optimizer_bytes_per_param=MEGATRON_LM_2021.optimizer_bytes_per_param))]
    assert m.step_time > max(parts)
