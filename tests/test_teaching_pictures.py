"""The tutorials' teaching pictures compute what they draw: the ring schedules against a plain sum,
the register replay against the register counts it claims."""

from __future__ import annotations

import pytest
import torch

import sbplab as sl
from sbplab.models import MLP, MLPConfig
from sbplab.viz.register_diagram import register_picture, run_ahead
from sbplab.viz.ring_picture import ring_picture, ring_run, ring_steps


@pytest.mark.parametrize("p", [2, 3, 4])
def test_ring_schedules_compute_the_collectives(p):
    torch.manual_seed(p)
    shards = [torch.randn(2 * p, 3) for _ in range(p)]
    total = sum(shards)
    for t in ring_run("all_reduce", shards):
        assert torch.allclose(t, total, atol=1e-5)
    for r, t in enumerate(ring_run("reduce_scatter", shards)):
        assert torch.allclose(t, torch.chunk(total, p)[(r + 1) % p], atol=1e-5)
    whole = torch.cat([torch.chunk(shards[r], p)[r] for r in range(p)])
    assert all(torch.equal(t, whole) for t in ring_run("all_gather", shards))
    # p - 1 steps of one chunk each: the boxing table's T(p-1)/p, twice for an all-reduce
    assert [len(ring_steps(k, p)) for k in ("reduce_scatter", "all_gather", "all_reduce")] == [p - 1, p - 1, 2 * p - 2]
    assert all(len(c) == p for row in ring_steps("all_reduce", p)[-1].holds for c in row)


def test_ring_picture_draws_every_step_and_refuses_bad_input():
    html = ring_picture("all_reduce", 4).html()
    assert html.count("<svg") == 6 and "step 6: all-gather" in html and "Σ" in html
    with pytest.raises(ValueError, match="kind must be one of"):
        ring_picture("broadcast", 4)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        ring_steps("all_gather", 1)


def test_registers_bound_how_far_a_stage_runs_ahead():
    torch.manual_seed(0)
    model = MLP(MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=2, n_classes=4))
    (x,), y = model.example_batch(16)
    step = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.pipeline(stages=2, micro_batches=4))
    for registers in (1, 2, 3, 4):
        ahead = run_ahead(step.plan(registers=registers), rank=0)
        assert ahead.sent == registers and ahead.waiting
        assert max(len(h) for h in ahead.held.values()) == registers
    src = register_picture(step.plan(registers=4), physical=step.physical).source
    assert ">m3<" in src and "proj_in" in src and "4 micro-batch(es) sent on" in src
