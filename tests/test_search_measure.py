"""``sl.search(measure_on=cluster)``: the simulated finalists run on real Gloo workers and the fastest
measured one wins; a cluster that cannot serve is refused before any search work."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import sbplab as sl
from sbplab.search import SearchError, search

CPU = sl.Hardware.cpu_box()


def _mlp():
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=16, width=32, hidden=64, n_blocks=1, n_classes=4))
    (x,), y = m.example_batch(16)
    return m, x, y


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


@pytest.mark.multiprocess
def test_the_fastest_measured_finalist_wins(cluster):
    m, x, y = _mlp()
    res = search(m, x, loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=sl.SGD(lr=0.1), devices=2,
                 hardware=CPU, measure_on=cluster)
    finalists = [c for c in (*res.candidates, *res.presets) if c.simulated_time is not None]
    measured = [c for c in finalists if c.measured_time is not None]
    assert len(finalists) >= 2 and measured == finalists  # every simulated finalist ran
    assert all(p.measured_time is not None for p in res.presets if p.step_time < float("inf"))  # every preset
    assert all(c.measured_time > 0 for c in measured)
    fastest = min(c.measured_time for c in measured)
    assert res.best.measured_time == fastest
    by_sim = min(finalists, key=lambda c: (c.simulated_time, c.method == "preset"))
    if res.best is not by_sim:  # the measurement overruled the simulator: the notes say so
        assert any("measured on the cluster" in n for n in res.notes)
    assert "chosen by the measured model" in res.table().splitlines()[0]
    assert all(r["model"] == "measured; memory simulated" for r in res.rows() if r["strategy"] in
               {c.describe() for c in measured})
    # the winner is an ordinary strategy: it compiles and trains on the same workers
    step = sl.compile(m, (x,), loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=res.strategy)
    want = torch.nn.functional.cross_entropy(m(x), y).item()
    assert cluster.run(step, (x, y), steps=1, progress=False).losses[0] == pytest.approx(want, rel=1e-5)


@pytest.mark.multiprocess
@pytest.mark.parametrize("kwargs, match", [
    ({"devices": 4}, "measure_on has 2 ranks but the search is for devices=4"),
    ({"rerank_top": 0}, "needs rerank_top > 0"),
    ({"meta": True}, "must be real tensors"),
])
def test_a_cluster_that_cannot_measure_is_refused_first(cluster, kwargs, match):
    m, x, y = _mlp()
    if kwargs.pop("meta", False):
        x = x.to("meta")
    with pytest.raises(SearchError, match=match):
        search(m, x, loss_fn=torch.nn.functional.cross_entropy, target=y, devices=kwargs.pop("devices", 2),
               hardware=CPU, measure_on=cluster, **kwargs)
    with pytest.raises(SearchError, match="must be a LocalCluster"):
        search(m, x, loss_fn=torch.nn.functional.cross_entropy, target=y, devices=2, hardware=CPU,
               measure_on="localhost")


@pytest.mark.parametrize("devices, cores, warned", [(4, 2, True), (2, 2, False), (4, None, False)])
def test_a_search_that_trusts_the_simulator_on_oversubscribed_cores_says_so(devices, cores, warned):
    """Ranks outnumbering the cores are where the simulator is least reliable: without ``measure_on`` the
    notes say so and name the remedy; with enough cores (or devices of their own) they do not."""
    m, x, y = _mlp()
    hw = dataclasses.replace(CPU, cores=cores)
    res = search(m, x, loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=sl.SGD(lr=0.1),
                 devices=devices, hardware=hw, pipelines=False, rerank_top=1)
    said = [n for n in res.notes if "share" in n and "measure_on=cluster" in n]
    assert bool(said) == warned, res.notes
    if warned:
        assert said[0].startswith(f"{devices} CPU ranks share {cores} cores")
