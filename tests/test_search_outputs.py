"""What sl.search shows: every figure from the model that chose the winner, labelled; every preset and
user candidate simulated; the time budget bounding the whole search; a device count with a bound; the
device memory as the default memory limit."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

import sbplab as sl
from sbplab.search import SearchError, search
from sbplab.search.capacity import MAX_DEVICES

H100 = sl.Hardware.h100_node()


def _mlp(n_blocks: int = 1, batch: int = 16, **kw):
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(n_blocks=n_blocks, **kw))
    (x,), y = m.example_batch(batch)
    return m, x, y


def _search(m, x, y, **kw):
    kw.setdefault("optimizer", sl.SGD(lr=0.1))
    return search(m, (x,), loss_fn=m.loss_fn, target=y, **kw)


@pytest.fixture(scope="module")
def simulated():
    """A re-ranked search on 4 H100 with one candidate of the user's on 2 of them."""
    m, x, y = _mlp(1, batch=16, width=64, hidden=256)
    mine = sl.presets.data_parallel(2)
    mine.name = "my dp on two"
    return _search(m, x, y, devices=4, hardware=H100, method="cd", pipelines=False, rerank_top=1,
                   candidates=[mine])


def test_every_row_is_in_the_model_that_chose_and_none_beats_the_winner(simulated):
    res = simulated
    assert res.model == "simulated" and res.predicted.source == "simulator"
    rows = res.rows()
    assert rows[0]["searched"] and rows[0]["ratio"] == 1.0
    # every preset and the user's candidate was simulated, or (a preset) listed at a floor under its simulated
    # time that rules it out, so every time in the table is the simulator's
    assert all(p.simulated_time is not None or p.sim_floor is not None for p in res.presets)
    assert res.users[0].simulated_time is not None
    assert {r["model"] for r in rows} <= {"simulated", "simulated floor; memory analytic"}
    for c, r in zip(res.listed(), rows):
        t = c.simulated_time if c.simulated_time is not None else c.sim_floor
        assert r["ms"] == pytest.approx(t * 1e3) and r["at_least"] == (c.simulated_time is None)
        assert r["memory"] == c.simulated_memory or c.simulated_time is None
        assert r["ratio"] == pytest.approx(t / res.best.simulated_time)
        assert r["ratio"] >= 1 - 1e-9  # the winner is the fastest the simulator saw
    table = res.table()
    assert "chosen by the simulated model" in table.splitlines()[0]
    assert all(" simulated " in line for line in table.splitlines()[2:])


def test_explain_compares_with_the_best_preset_in_the_same_model(simulated):
    res = simulated
    p = res.best_preset()
    assert p is min([c for c in res.presets if c.simulated_time is not None], key=lambda c: c.simulated_time)
    text = res.explain()
    if p is not res.best:
        saved = (1 - res.best.simulated_time / p.simulated_time) * 100
        assert f"{saved:.1f}%" in text and "(simulated; saves" in text


def test_a_user_candidate_is_compared_and_says_it_uses_fewer_devices(simulated):
    res = simulated
    (mine,) = res.users
    assert mine.method == "user" and mine.label == "yours: my dp on two"
    line = next(ln for ln in res.table().splitlines() if "yours: my dp on two" in ln)
    assert "[2 of 4 devices]" in line
    assert res.figure(mine).step_time >= res.figure(res.best).step_time


def test_a_user_candidate_that_is_not_a_strategy_or_too_big_is_refused():
    m, x, y = _mlp(0)
    with pytest.raises(SearchError, match=r"candidates\[0\] must be an sl.Strategy"):
        _search(m, x, y, devices=2, candidates=["dp"])
    with pytest.raises(SearchError, match=r"runs on 4 ranks but the search is for devices=2"):
        _search(m, x, y, devices=2, candidates=[sl.presets.data_parallel(4)])


def test_the_time_budget_bounds_the_re_rank():
    """A budget already spent when the re-rank begins simulates nothing: the winner is the analytic
    one, labelled so, and a note names what was left."""
    m, x, y = _mlp(2, batch=32)
    res = _search(m, x, y, devices=8, hardware=H100, method="cd", time_budget=1e-3, rerank_top=3)
    assert res.best_so_far and res.model == "analytic" and res.predicted.source == "analytic"
    assert all(c.simulated_time is None for c in (*res.candidates, *res.presets))
    assert any("time budget ran out during the re-rank" in n for n in res.notes)
    assert "chosen by the analytic model" in res.table()


class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x)


@pytest.mark.parametrize("devices", [MAX_DEVICES + 1, 10**6])
def test_a_device_count_beyond_the_bound_is_refused_before_any_work(devices):
    m = _Counting()
    with pytest.raises(SearchError, match=f"devices={devices} is more than the {MAX_DEVICES} ranks"):
        search(m, (torch.randn(4, 4),), loss_fn=nn.functional.mse_loss, target=torch.randn(4, 4), devices=devices,
               time_budget=30)
    assert m.calls == 0


@dataclass(frozen=True)
class _SmallDevices(sl.Hardware):
    """A machine model that knows its device memory."""

    memory_bytes: float = 1.0


def test_the_device_memory_is_the_default_memory_limit():
    m, x, y = _mlp(0)
    hw = _SmallDevices(**{f: getattr(H100, f) for f in H100.__dataclass_fields__})
    with pytest.raises(SearchError, match=r"\(the device memory of the hardware\); the least memory"):
        _search(m, x, y, devices=2, hardware=hw, rerank_top=0, pipelines=False)
    roomy = _SmallDevices(**{f: getattr(H100, f) for f in H100.__dataclass_fields__}, memory_bytes=80e9)
    res = _search(m, x, y, devices=2, hardware=roomy, rerank_top=0, pipelines=False)
    assert any("the device memory of the hardware" in n for n in res.notes)
