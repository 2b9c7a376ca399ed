"""Faults: a failing kernel, a killed worker, a hung collective and Ctrl-C end a run cleanly."""

from __future__ import annotations

import _thread
import multiprocessing
import os
import threading

import pytest
import torch

from sbplab import B, Placement
from sbplab.runtime import ActorPlan, Collective, Compute, LocalCluster, RunError, Sink, State

pytestmark = pytest.mark.multiprocess
K = "sbplab.runtime.kernels:"


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(2)
    yield c
    pids = c.pids
    c.close()
    _assert_gone(pids)


def _assert_gone(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    alive = {p.pid for p in multiprocessing.active_children()}
    assert not alive & set(pids)


def _plan(kernel_on_1: str, attrs: dict | None = None) -> ActorPlan:
    """Each rank: x -> f -> all-reduce -> sink. Rank 1's f is the faulty one."""
    pl = Placement("cpu", [0, 1])
    ranks = {}
    for r in (0, 1):
        op = kernel_on_1 if r == 1 else K + "noop"
        ranks[r] = [State("x", init=torch.full((3,), float(r + 1))),
                    Compute("f", op=op, inputs=("x",), attrs=attrs if r == 1 else {}),
                    Collective("ar", group=(0, 1), inputs=("f",)),
                    Sink("out", inputs=("ar",), key="sum", placement=pl, sbp=(B,))]
    return ActorPlan.build(2, ranks, name="faulty")


def _healthy_run(cluster):
    res = cluster.run(_plan(K + "noop"), steps=2, progress=False)
    assert all(torch.equal(v, torch.full((3,), 3.0)) for v in res.outputs["sum"])


def test_exception_in_a_worker_names_rank_actor_op_and_traceback(cluster):
    _healthy_run(cluster)
    pids = cluster.pids
    with pytest.raises(RunError) as e:
        cluster.run(_plan(K + "fail", {"message": "boom on purpose"}), progress=False)
    err = e.value
    assert err.kind == "exception" and err.rank == 1 and err.actor == "f" and err.op.endswith(":fail")
    assert "boom on purpose" in str(err) and "kernels.py" in err.worker_traceback
    assert not cluster.alive
    _assert_gone(pids)  # the other worker, stuck in the all-reduce, was torn down too
    _healthy_run(cluster)  # fresh workers on the next run
    assert set(cluster.pids).isdisjoint(pids)


def test_sigkill_of_a_worker(cluster):
    pids = cluster.pids
    with pytest.raises(RunError) as e:
        cluster.run(_plan(K + "fail", {"kill": True}), progress=False)
    err = e.value
    assert err.kind == "died" and err.rank == 1 and "SIGKILL" in str(err)
    assert err.actor == "f"  # read from the dead worker's activity slots
    _assert_gone(pids)
    _healthy_run(cluster)


def test_hung_collective_times_out_with_what_each_rank_was_doing(cluster):
    pids = cluster.pids
    with pytest.raises(RunError) as e:
        cluster.run(_plan(K + "delay", {"ms": 120_000}), timeout=2.0, progress=False)
    err = e.value
    assert err.kind == "hang" and err.rank == 1 and err.actor == "f"
    text = str(err)
    assert "rank 0: comm lane waits in 'ar' (all_reduce)" in text
    assert "rank 1: compute lane runs 'f'" in text and "time.sleep" in err.worker_traceback
    _assert_gone(pids)
    _healthy_run(cluster)


def test_keyboard_interrupt_stops_the_run_and_the_cluster_comes_back(cluster):
    pids = cluster.pids
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.run(_plan(K + "delay", {"ms": 60_000}), timeout=120.0, progress=False)
    finally:
        timer.cancel()
    assert not cluster.alive
    _assert_gone(pids)
    _healthy_run(cluster)
    assert cluster.alive
