"""The re-rank's floor from a deduction (``deduced_floor.py``) is a floor: on every rank, the simulator's
compute lane is busy at least as long as the floor's ops take, or its communication lane as long as the
floor's collectives take, and so the simulated step is above it; and a finalist it rules out is one the
simulation confirms could not have won."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
import torch

import sbplab as sl
from sbplab.search.deduced_floor import deduced_floor
from sbplab.search.sim_floor import MARGIN, Floors

H100 = sl.Hardware.h100_node()
SLOW = replace(H100, name="slow device", flops=H100.flops / 1000, flops_bf16=None, mem_bandwidth=H100.mem_bandwidth / 1000)
MACHINE = sl.Machine.h100_node()  # GEMM efficiency rising with size, collectives by the ranks they span
CPU = sl.Hardware.cpu_box()  # ranks sharing cores: a computing rank slows the others and their transfers


def _gpt():
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=128))
    (idx,), y = m.example_batch(16)
    return m, (idx,), {"loss_fn": m.loss_fn, "target": y}


def _gpt2():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    x = torch.randint(0, 128, (16, 32))
    return tf.GPT2LMHeadModel(cfg), {"input_ids": x, "labels": x}, {}


STRATEGIES = {
    "dp": lambda: sl.presets.data_parallel(8),
    "dp_accumulating": lambda: sl.presets.data_parallel(8, micro_batches=2),  # a kernel per micro-batch or step
    "zero2": lambda: sl.presets.zero(8, shard_params=False),
    "zero3": lambda: sl.presets.zero(8),
    "dp_tp": lambda: sl.presets.dp_tp((2, 4), vocab=False),
    "pipeline": lambda: sl.presets.pipeline(2, 4, 4, inner="dp"),
    "mixed+recompute": lambda: replace(sl.presets.dp_tp((4, 2), vocab=False), precision=sl.Precision.mixed("bf16"),
                                       recompute="full"),
}


def _lanes(pred) -> float:
    """The busiest lane of any simulated rank, seconds per step: compute or communication."""
    f, busy = pred.firings, defaultdict(float)
    for i in range(len(f)):
        busy[(f.rank[i], f.lane[i])] += f.end[i] - f.xfer[i]
    return max(busy.values()) / pred.steps


@pytest.mark.parametrize("model", ["gpt", "transformers_gpt2"])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_deduced_floor_is_below_the_busiest_lane_and_the_step(model, name):
    m, xs, kw = _gpt() if model == "gpt" else _gpt2()
    step = sl.compile(m, xs, strategy=STRATEGIES[name](), **kw)
    for hw in (H100, SLOW, MACHINE, CPU):
        pred = sl.simulate(step, hw)
        f = deduced_floor(step.deduction, hw)
        assert 0 < f <= _lanes(pred) * (1 + 1e-9), (hw.name, f, _lanes(pred))
        assert f * (1 - MARGIN) <= pred.step_time, (hw.name, f, pred.step_time)


def test_a_finalist_its_deduction_rules_out_is_one_the_simulator_puts_behind():
    """ZeRO-3 on H100 links: the gathers of every weight in forward and backward keep each rank's
    communication lane busy for longer than data parallel's whole step takes."""
    m, xs, kw = _gpt()
    big = sl.models.GPT(sl.models.GPTConfig(vocab_size=50304, block_size=64, n_layer=2, n_head=4, n_embd=128))
    dp = sl.simulate(sl.compile(big, xs, strategy=sl.presets.data_parallel(8), **kw), H100)
    zero3 = sl.compile(big, xs, strategy=sl.presets.zero(8), **kw)
    floors = Floors(H100)
    floors.best = floors.best_preset = dp.step_time

    class Finalist:  # the two fields the floors read of a candidate
        method, sim_floor, label = "preset", None, "ZeRO-3 x8"

    c = Finalist()
    assert floors.cannot_win_deduced(c, zero3.deduction, H100)
    assert c.sim_floor * (1 - MARGIN) > dp.step_time
    assert sl.simulate(zero3, H100).step_time >= c.sim_floor * (1 - MARGIN) > dp.step_time


def test_a_floor_that_cannot_be_worked_out_spares_no_finalist(monkeypatch):
    """A deduction the floor cannot price (an op or kind it fails on) means no floor: simulated as before."""
    import sbplab.search.sim_floor as sim_floor

    def fails(d, hw):
        raise KeyError("an op the floor cannot price")

    monkeypatch.setattr(sim_floor, "deduced_floor", fails)
    floors = Floors(H100)
    floors.best = floors.best_preset = 1e-9  # anything with a floor would be ruled out

    class Finalist:
        method, sim_floor, label = "preset", None, "ZeRO-3 x8"

    assert not floors.cannot_win_deduced(Finalist(), None, H100)
    assert floors.deduced and not floors.skipped
