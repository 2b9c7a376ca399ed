"""Threads: a second run on a busy cluster is refused as busy (the first goes on undisturbed), and a
cluster closed from another thread ends its run with an error that says so, not a crash report."""

from __future__ import annotations

import threading

import pytest
import torch
from fault_helpers import Snapshot, check_dp_run, wait_until

from sbplab import B, ClusterError, Placement, RunError
from sbplab.runtime import ActorPlan, Collective, Compute, LocalCluster, Sink, State
from sbplab.runtime.driver import BUSY_MESSAGE, CLOSED_DURING_RUN_MESSAGE

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]


def _slow_plan(mark: str, ms: float) -> ActorPlan:
    """Two ranks: each sleeps ``ms`` in a kernel, then they all-reduce."""
    pl = Placement("cpu", [0, 1])
    ranks = {r: [State("x", init=torch.ones(3)),
                 Compute("f", op="fault_kernels:sleep_through", inputs=("x",), attrs={"mark": mark, "ms": ms}),
                 Collective("ar", group=(0, 1), inputs=("f",)),
                 Sink("out", inputs=("ar",), key="sum", placement=pl, sbp=(B,))] for r in (0, 1)}
    return ActorPlan.build(2, ranks, name="slow")


@pytest.fixture(scope="module")
def cluster():
    """One cluster for both tests (the second closes it), and what this process held before it started."""
    before = Snapshot.take()
    c = LocalCluster(2)
    yield c, before
    c.close()


def test_a_second_run_from_another_thread_is_refused_as_busy(cluster, tmp_path):
    c, _ = cluster
    check_dp_run(c)
    mark = tmp_path / "reached"
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("res", c.run(_slow_plan(str(mark), 1500), steps=2,
                                                                     progress=False, timeout=60)))
    t.start()
    wait_until(mark.exists, 60, "the first run reaching its kernel")
    with pytest.raises(ClusterError, match="busy: another run is going") as e:
        check_dp_run(c)
    assert str(e.value) == BUSY_MESSAGE  # as docs/errors.md shows it
    t.join(60)
    assert [float(v[0]) for v in box["res"].outputs["sum"]] == [2.0, 2.0]  # the first run finished
    check_dp_run(c)  # and the cluster takes the next one


def test_close_from_another_thread_reads_as_a_close(cluster, tmp_path):
    c, before = cluster
    check_dp_run(c)
    pids, address = list(c.pids), c.address
    mark = tmp_path / "reached"
    closer = threading.Thread(target=lambda: (wait_until(mark.exists, 60, "the run reaching its kernel"), c.close()))
    closer.start()
    with pytest.raises(ClusterError, match="closed") as e:
        c.run(_slow_plan(str(mark), 60_000), steps=1, progress=False, timeout=120)
    closer.join(60)
    assert not isinstance(e.value, RunError) and str(e.value) == CLOSED_DURING_RUN_MESSAGE
    before.assert_clean(address, pids)
