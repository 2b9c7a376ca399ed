"""A rank that fails in the middle of a compiled training step (raises, is SIGKILLed, exits with the
OOM killer's code 137, or is stopped by SIGSTOP) ends the run at once with a ``RunError`` that names
that rank and why; no worker survives it, the next run on the same cluster starts fresh workers and
trains exactly like single-device PyTorch, and closing leaves no thread, socket or process behind."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from threading import Thread

import pytest
import torch
from fault_helpers import Snapshot, gone, wait_until

from sbplab.compiler import SGD, compile, presets
from sbplab.compiler.reference import torch_steps
from sbplab.models import MLP, MLPConfig
from sbplab.runtime import ActorPlan, Compute, LocalCluster, RunError

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]

DETECT_S = 10.0  # a fault must end the run within this; the hang timeout is far longer unless stated


@pytest.fixture(scope="module")
def mlp():
    """A compiled data-parallel MLP step on 2 ranks, its inputs, and plain PyTorch's losses."""
    torch.manual_seed(0)
    model = MLP(MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    xs, y = model.example_batch(8)
    loss_fn = torch.nn.functional.cross_entropy
    step = compile(model, xs, loss_fn=loss_fn, target=y, optimizer=SGD(lr=0.1),
                   strategy=presets.data_parallel(2))
    ref_losses, _ = torch_steps(model, xs, target=y, loss_fn=loss_fn, optimizer=SGD(lr=0.1), steps=3)
    return step, (*xs, y), ref_losses


@pytest.fixture(scope="module")
def cluster():
    """One cluster through every fault (each case starts on healthy workers and leaves them healthy);
    after close, nothing of it (or of the workers it had on the way) may be left in this process."""
    before = Snapshot.take()
    c = LocalCluster(2)
    seen: list[int] = list(c.pids)
    c.seen = seen  # every worker pid it has had, for the final check
    yield c
    seen += c.pids
    address = c.address
    c.close()
    before.assert_clean(address, seen)


@pytest.fixture
def healthy(cluster, mlp):
    """Workers up and in step before the fault, so the time to the error counts no respawn."""
    if not cluster.alive:
        _check_step(cluster, mlp)
    return cluster


def _check_step(cluster, mlp) -> None:
    """The real step on (possibly respawned) workers gives PyTorch's losses (from the compiled weights:
    runs of a step otherwise continue where the last one stopped)."""
    step, inputs, ref_losses = mlp
    res = cluster.run(step, inputs, steps=3, progress=False, timeout=30.0, restart=True)
    assert res.losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    cluster.seen += cluster.pids


def _with_kernel(plan: ActorPlan, rank: int, op: str, attrs: dict) -> tuple[ActorPlan, str]:
    """The plan with rank ``rank``'s first forward compute actor running ``op`` instead."""
    acts = list(plan.ranks[rank].actors)
    i = next(i for i, a in enumerate(acts) if isinstance(a, Compute) and a.phase == "forward")
    acts[i] = dataclasses.replace(acts[i], op=op, attrs=attrs)
    ranks = {r: (acts if r == rank else list(rp.actors)) for r, rp in plan.ranks.items()}
    return dataclasses.replace(plan, ranks=ranks), acts[i].name


def _assert_all_gone(pids: list[int]) -> None:
    assert all(gone(p) for p in pids), {p: gone(p) for p in pids}


@pytest.mark.parametrize("how,kind,cause", [
    ("raise", "exception", "MemoryError: out of memory on purpose"),
    ("sigkill", "died", "SIGKILL"),
    ("exit137", "died", "exit code 137"),
])
def test_a_rank_failing_mid_step_is_named_and_the_cluster_comes_back(healthy, mlp, how, kind, cause):
    cluster = healthy
    step, inputs, _ = mlp
    pids = cluster.pids
    plan, actor = _with_kernel(step.plan(world_size=2), 1, "fault_kernels:fault", {"how": how, "ms": 300})
    t0 = time.monotonic()
    with pytest.raises(RunError) as e:
        cluster.run(plan, step.feeds(inputs), steps=3, progress=False, timeout=60.0)
    took = time.monotonic() - t0
    err = e.value
    assert took < DETECT_S, f"the fault took {took:.1f} s to surface"
    assert err.kind == kind and err.rank == 1 and err.actor == actor, (err.kind, err.rank, err.actor)
    assert cause in str(err) and "rank 1" in str(err)
    if how == "exit137":
        assert "OOM" in str(err)
    assert not cluster.alive
    _assert_all_gone(pids)  # the healthy rank, stuck in the gradient all-reduce, was torn down too
    _check_step(cluster, mlp)
    assert set(cluster.pids).isdisjoint(pids)


def test_a_stopped_rank_is_blamed_for_the_hang_not_the_rank_waiting_for_it(healthy, mlp, tmp_path):
    """Rank 0 (which also holds the rendezvous store) is stopped inside a kernel; rank 1 waits for it
    in the gradient all-reduce, answers the driver, and is the victim, not the culprit."""
    cluster = healthy
    stopped = 0
    step, inputs, _ = mlp
    pids = cluster.pids
    mark = tmp_path / "reached"
    plan, actor = _with_kernel(step.plan(world_size=2), stopped, "fault_kernels:sleep_through",
                               {"mark": str(mark), "ms": 500})

    def stop_when_reached() -> None:
        wait_until(mark.exists, 30, "rank reaching the marked kernel")
        os.kill(pids[stopped], signal.SIGSTOP)

    t = Thread(target=stop_when_reached, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(RunError) as e:
            cluster.run(plan, step.feeds(inputs), steps=50, progress=False, timeout=2.0)
        took = time.monotonic() - t0
    finally:
        t.join(timeout=30)
        _resume(pids)
    err = e.value
    assert took < DETECT_S, f"the hang took {took:.1f} s to surface"
    assert err.kind == "hang" and err.rank == stopped, str(err)
    assert "stopped" in str(err) and f"rank {stopped}" in str(err)
    assert err.actor == actor  # its last compute firing, read from its activity slots
    _assert_all_gone(pids)
    _check_step(cluster, mlp)
    assert set(cluster.pids).isdisjoint(pids)


def _resume(pids) -> None:
    """SIGCONT every process of ``pids`` still alive (a test stopped one)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_rank_stopped_between_runs_fails_the_next_run_at_once_by_name(healthy, mlp):
    """An idle worker answers the driver's clock pings at once; a stopped one never will, so the run
    must not wait on it (it used to wait forever, whatever the timeout)."""
    cluster = healthy
    step, inputs, _ = mlp
    pids = cluster.pids
    os.kill(pids[1], signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(RunError) as e:
            cluster.run(step, inputs, steps=3, progress=False, timeout=60.0)
        took = time.monotonic() - t0
    finally:
        _resume(pids)
    err = e.value
    assert took < DETECT_S, f"the stopped rank took {took:.1f} s to surface"
    assert err.kind == "hang" and err.rank == 1 and "rank 1" in str(err) and "stopped" in str(err), str(err)
    _assert_all_gone(pids)
    _check_step(cluster, mlp)
    assert set(cluster.pids).isdisjoint(pids)
