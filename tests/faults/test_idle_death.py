"""A worker that dies while the cluster is idle (OOM killer, a stray signal) is noticed: ``alive`` turns
False and the next run starts fresh workers and gives the right losses."""

from __future__ import annotations

import os
import signal

import pytest
from fault_helpers import check_dp_run, gone, wait_until

from sbplab.runtime import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(2) as c:
        yield c


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_worker_killed_while_idle_is_replaced_on_the_next_run(cluster, sig):
    check_dp_run(cluster)
    assert cluster.alive
    old = cluster.pids
    os.kill(old[1], sig)
    wait_until(lambda: not cluster.alive, 10, "noticing the dead worker")
    check_dp_run(cluster)
    assert cluster.alive
    assert set(cluster.pids).isdisjoint(old)
    assert all(gone(p) for p in old)  # the survivor was torn down and reaped, not left behind


def test_workers_are_out_of_reach_of_a_jupyter_interrupt(cluster):
    """Jupyter interrupts by SIGINT to the kernel's process group; workers have sessions of their own."""
    check_dp_run(cluster)
    for pid in cluster.pids:
        assert os.getpgid(pid) != os.getpgid(0)
        assert os.getsid(pid) == pid
