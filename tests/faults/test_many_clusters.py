"""Three clusters in one process at once: each its own port, token, workers and rendezvous; started and
run from threads at the same time, then one after another interleaved; each trains like plain PyTorch
on its own data, and closing them all leaves nothing behind."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from fault_helpers import Snapshot, check_dp_run

from sbplab.runtime import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]


def test_three_clusters_run_concurrently_and_interleaved_and_close_cleanly():
    before = Snapshot.take()
    with ThreadPoolExecutor(3) as pool:
        clusters = list(pool.map(lambda _: LocalCluster(2), range(3)))  # started at the same time
    pids: list[int] = []
    try:
        assert len({c.address for c in clusters}) == 3 and len({c.token for c in clusters}) == 3
        pids = [p for c in clusters for p in c.pids]
        assert len(set(pids)) == 6
        with ThreadPoolExecutor(3) as pool:  # each checks its own losses against its own reference
            together = list(pool.map(lambda ic: check_dp_run(ic[1], steps=3, seed=ic[0]), enumerate(clusters)))
        assert len({tuple(ls) for ls in together}) == 3  # three different problems, no mix-up
        for _ in range(2):
            for i, c in enumerate(clusters):
                assert check_dp_run(c, steps=3, seed=i) == together[i]
        assert [p for c in clusters for p in c.pids] == pids  # nobody was respawned on the way
    finally:
        addresses = [c.address for c in clusters]
        for c in clusters:
            c.close()
    for address in addresses:
        before.assert_clean(address, pids)
