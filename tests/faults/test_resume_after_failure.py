"""A failure loses nothing already kept: a worker SIGKILLed or stopped (the run hangs) in step 15 of
a 30-step run with ``checkpoint_every=5`` leaves the state after step 10 on the driver (or after step 15, when
the workers finish that chunk before the driver's signal lands); the RunError
says so, and the next run, on fresh workers, trains on exactly like the run that never failed (the
same holds at any length: 200 steps, killed at step 54 with checkpoint_every=10, keep step 50)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import sbplab as sl

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    (x,), y = model.example_batch(8)
    step = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=sl.Adam(lr=0.01),
                      strategy=sl.presets.data_parallel(2))
    with sl.LocalCluster(2) as cluster:
        whole = cluster.run(step, (x, y), steps=30, progress=False)  # the run that never fails
        yield cluster, step, (x, y), whole


@pytest.mark.parametrize("how", ["sigkill", "hang"])
def test_a_failure_in_step_15_keeps_step_10_and_the_next_run_continues_from_it(setup, how):
    cluster, step, batch, whole = setup
    seen = []

    def strike(s, steps, loss):
        seen.append(s)
        if s == 13:  # 14 steps done on every rank: rank 1 dies (or stops) in step 15 or 16
            os.kill(cluster.pids[1], signal.SIGKILL if how == "sigkill" else signal.SIGSTOP)

    with pytest.raises(sl.RunError) as err:
        cluster.run(step, batch, steps=30, progress=False, restart=True, checkpoint_every=5, on_step=strike,
                    timeout=1.0)
    e = err.value
    kept = e.kept_step
    # a signal sent from the driver's on_step may land after the workers (which run ahead of the driver)
    # finished the chunk of steps 11-15: then step 15 is kept, and the failure shows at the next chunk's start
    assert kept in (10, 15)
    assert e.kind == {"sigkill": "died", "hang": "hang"}[how]
    assert f"The state after step {kept} is kept (on the driver)" in str(e)
    assert seen == list(range(max(14, kept)))  # on_step counts over the whole run; step 15 did not finish
    assert e.partial.losses == whole.losses[:kept] and e.partial.steps == kept  # the kept steps' results
    rest = cluster.run(step, batch, steps=30 - kept, progress=False)  # fresh workers, from the driver's copy
    assert rest.losses == whole.losses[kept:]
    for name, v in whole.params.items():  # parameters and Adam's moments, to the bit
        assert torch.equal(rest.params[name].full(), v.full()), name


def test_a_bad_target_in_step_15_is_refused_before_the_run_and_costs_nothing(setup):
    """A class index the model does not have is found on the driver before any step runs: no worker raises,
    none is respawned, and the state is where it was."""
    cluster, step, (x, y), whole = setup
    cluster.run(step, (x, y), steps=3, progress=False, restart=True)
    pids = cluster.pids
    bad = y.clone()
    bad[-1] = 100
    batches = [(x, bad if s == 14 else y) for s in range(30)]
    with pytest.raises(sl.SbplabError, match=r"the batch of step 14: input 'target' holds 100"):
        cluster.run(step, batches, steps=30, progress=False)
    assert cluster.pids == pids
    assert cluster.run(step, (x, y), steps=2, progress=False).losses == whole.losses[3:5]


def test_without_checkpoint_every_the_last_finished_run_is_what_is_kept(setup):
    cluster, step, batch, whole = setup
    cluster.run(step, batch, steps=3, progress=False, restart=True)

    def kill(s, steps, loss):
        if s == 1:
            os.kill(cluster.pids[0], signal.SIGKILL)

    with pytest.raises(sl.RunError, match="The state after step 3 is kept") as err:
        cluster.run(step, batch, steps=10, progress=False, on_step=kill)
    assert err.value.kept_step == 3
    assert cluster.run(step, batch, steps=2, progress=False).losses == whole.losses[3:5]
