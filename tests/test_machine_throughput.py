"""Throughput as papers report it (tokens/s, model TFLOP/s per device, MFU) and the pricing of a strategy's
precision and recomputation, on a small GPT and the H100 machine model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import sbplab as sl
from sbplab.models import GPT, GPTConfig
from sbplab.sim.firing_cost import compute_cost
from sbplab.sim.shapes import infer_rank_shapes
from sbplab.sim.step_pricing import pricing_of

CFG = GPTConfig(vocab_size=128, block_size=32, n_layer=2, n_head=4, n_embd=64)
B = 8


@pytest.fixture(scope="module")
def step():
    torch.manual_seed(0)
    model = GPT(CFG)
    (x,), y = model.example_batch(B)
    return sl.compile(model, (x,), loss_fn=GPT.loss_fn, target=y, optimizer=sl.Adam(lr=1e-3),
                      strategy=sl.presets.data_parallel(2, micro_batches=2))


def _with(step, **options):
    """The same compiled graph, its strategy asking for ``options`` (a what-if the graph does not carry)."""
    return dataclasses.replace(step, strategy=dataclasses.replace(step.strategy, **options))


def test_throughput_fields_follow_from_the_step_time_and_the_graphs_flops(step):
    m = sl.Machine.h100_node()
    pred = sl.simulate(step, m)
    T, C, L, V = CFG.block_size, CFG.n_embd, CFG.n_layer, CFG.vocab_size
    tokens = B * T
    assert pred.tokens_per_second == pytest.approx(tokens / pred.step_time)
    assert pred.samples_per_second == pytest.approx(B / pred.step_time)
    # forward matmuls by hand: q, k, v, proj (4 C^2) and the MLP (8 C^2) per layer, the scores and the
    # weighted values (2 T C per token per layer), the output layer; backward twice the forward
    mm = 2 * tokens * (12 * C * C * L + C * V) + 4 * B * T * T * C * L
    assert 3 * mm <= pred.model_flops <= 3.3 * mm
    assert pred.tflops_per_device() == pytest.approx(pred.model_flops / pred.step_time / 2 / 1e12)
    assert pred.mfu == pytest.approx(pred.tflops_per_device() * 1e12 / m.device.peak("fp32"))
    assert "MFU" in pred.summary()


def test_mixed_precision_is_priced_at_the_compute_dtype(step):
    m = sl.Machine.h100_node()
    fp32 = sl.simulate(step, m)
    mixed = sl.simulate(_with(step, precision=sl.Precision.mixed("bf16")), m)
    assert pricing_of(_with(step, precision=sl.Precision.mixed("bf16"))).compute_dtype == torch.bfloat16
    assert mixed.step_time < fp32.step_time
    assert mixed.model_flops == fp32.model_flops  # the same work, faster
    assert mixed.mfu == pytest.approx(mixed.tflops_per_device() * 1e12 / m.device.peak("bf16"))


def _kernel_seconds(step, m, names) -> float:
    """Seconds per step of rank 0's actors named ``names`` (each micro-batch's firing)."""
    plan = step.plan()
    rp = plan.ranks[0]
    shapes = infer_rank_shapes(rp.actors, 0, plan.micro_batches, _batch(step), {})
    return sum(compute_cost(a, shapes[a.name], m, "cuda").seconds for a in rp.actors
               if a.name in names) * plan.micro_batches


def _batch(step):
    from sbplab.sim.predict import plan_of

    return plan_of(step)[1]


def test_recomputation_adds_the_recomputed_forward_to_the_backward(step):
    m = sl.Machine.h100_node()
    base = sl.simulate(step, m)
    full, sel = _with(step, recompute="full"), _with(step, recompute="selective")
    p_full, p_sel = pricing_of(full), pricing_of(sel)
    full_names = {n for r, n in p_full.recomputed if r == 0}
    sel_names = {n for r, n in p_sel.recomputed if r == 0}
    assert sel_names and sel_names < full_names  # the attention cores are part of the layers
    extra = _kernel_seconds(step, m, full_names)
    pf, ps = sl.simulate(full, m), sl.simulate(sel, m)
    assert pf.breakdown[0]["compute"] - base.breakdown[0]["compute"] == pytest.approx(extra, rel=0.02)
    assert base.step_time < ps.step_time < pf.step_time
    assert pf.model_flops == base.model_flops and p_full.recompute_flops > p_sel.recompute_flops > 0
    assert pf.tflops_per_device(with_recompute=True) > pf.tflops_per_device()


def test_a_graph_that_recomputes_itself_is_priced_as_it_is():
    torch.manual_seed(0)
    model = GPT(CFG)
    (x,), y = model.example_batch(B)
    st = dataclasses.replace(sl.presets.data_parallel(2), recompute="full")
    c = sl.compile(model, (x,), loss_fn=GPT.loss_fn, target=y, optimizer=sl.Adam(lr=1e-3), strategy=st)
    p = pricing_of(c)
    assert not p.recomputed and p.recompute_flops > 0  # the clones are in the graph: nothing added twice


def test_activations_move_at_the_compute_dtype_gradient_reductions_at_their_own():
    torch.manual_seed(0)
    model = GPT(CFG)
    (x,), y = model.example_batch(B)
    c = sl.compile(model, (x,), loss_fn=GPT.loss_fn, target=y, optimizer=sl.Adam(lr=1e-3),
                   strategy=sl.presets.dp_tp((2, 2), micro_batches=2))
    m = sl.Machine.h100_node()
    fp32, mixed = sl.simulate(c, m), sl.simulate(_with(c, precision=sl.Precision.mixed("bf16")), m)
    actors = c.plan().ranks[0].actors
    ratios: dict[tuple[str, str], set[float]] = {}
    for i, a in enumerate(actors):
        if a.lane == "comm" and fp32.sent_bytes[0][i]:
            ratios.setdefault((a.phase, a.scope), set()).add(round(mixed.sent_bytes[0][i] / fp32.sent_bytes[0][i], 3))
    assert ratios[("forward", "micro")] == {0.5} and ratios[("backward", "micro")] == {0.5}
    assert ratios[("backward", "step")] == {1.0}  # the gradients' reduction, in Precision.grad = fp32
