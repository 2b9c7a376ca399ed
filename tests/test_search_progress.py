"""sl.search's on_progress: one report per unit of work, in order, ending "done" with the winner; a
search with it finds exactly what a search without it finds."""

from __future__ import annotations

import math

import pytest
import torch

import sbplab as sl
from sbplab.search import SearchError, SearchProgress, search
from sbplab.search.clock import Clock
from sbplab.search.search_progress import ProgressReporter

H100 = sl.Hardware.h100_node()


def _mlp(batch: int = 16):
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=2, n_classes=4))
    (x,), y = m.example_batch(batch)
    return m, x, y


def _search(m, x, y, **kw):
    kw.setdefault("devices", 4)
    return search(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), hardware=H100, **kw)


@pytest.mark.parametrize("method,devices", [("cd", 4), ("exact", 2)])
def test_progress_counts_every_unit_and_changes_nothing(method, devices):
    m, x, y = _mlp()
    plain = _search(m, x, y, method=method, devices=devices)
    seen: list[SearchProgress] = []
    res = _search(m, x, y, method=method, devices=devices, on_progress=seen.append)
    # the same search: same winner, same candidates, same prediction
    assert res.best.describe() == plain.best.describe()
    assert [(c.describe(), c.step_time, c.memory) for c in res.candidates] == \
        [(c.describe(), c.step_time, c.memory) for c in plain.candidates]
    assert res.predicted == plain.predicted
    # one report per unit, counted up by one; the plan is known from the first report on
    assert [p.done for p in seen[:-1]] == list(range(1, len(seen)))
    total = seen[0].total
    assert all(p.total == total for p in seen) and seen[-2].done == total
    phases = [p.phase for p in seen]
    n_presets = len(res.presets) + sum(n.startswith("preset ") for n in res.notes)
    # presets without stages first (they seed the meshes); a pipeline preset once the meshes tell whether it could win
    n_plain = sum(p.n_stages == 1 for p in res.presets)
    assert phases[:n_plain] == ["presets"] * n_plain and phases.count("presets") == n_presets
    assert phases[-4:] == ["simulating"] * 3 + ["done"]  # rerank_top=3 finalists, then the end
    assert "meshes" in phases and "pipelines" in phases
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and fractions[0] > 0
    # the best so far never gets worse, starts once a space is solved, and is a searched candidate's
    bests = [p.best_time for p in seen]
    assert all(math.isinf(b) for b in bests[:n_plain])
    finite = bests[n_plain:-1]
    assert finite == sorted(finite, reverse=True) and not math.isinf(finite[-1])
    searched = {c.describe(): c.step_time for c in res.candidates}
    assert all(searched[p.best] == p.best_time for p in seen[n_plain:-1])
    assert min(searched.values()) == pytest.approx(finite[-1])
    assert seen[-1].best == res.best.describe() and seen[-1].best_time == res.best.step_time
    assert all(a.seconds <= b.seconds for a, b in zip(seen, seen[1:]))


def test_the_best_so_far_respects_the_memory_limit():
    m, x, y = _mlp()
    free = _search(m, x, y, method="cd", pipelines=False)
    cands = sorted(free.candidates, key=lambda c: c.step_time)
    limit = cands[0].memory - 1  # the fastest does not fit
    seen: list[SearchProgress] = []
    report = ProgressReporter(seen.append, Clock(), limit)
    report.plan(len(cands))
    for c in cands:
        report.step("meshes", c)
    fits = [c for c in cands if c.memory <= limit]
    assert fits and len(fits) < len(cands)
    assert seen[0].best == "" and math.isinf(seen[0].best_time)  # the fastest came first and did not fit
    assert seen[-1].best_time == fits[0].step_time and seen[-1].best == fits[0].describe()
    # and a whole search under that limit reports only what fits
    got: list[SearchProgress] = []
    res = _search(m, x, y, method="cd", pipelines=False, memory_limit=limit, on_progress=got.append)
    fitting = {(c.describe(), c.step_time) for c in res.candidates if c.memory <= limit}
    assert {(p.best, p.best_time) for p in got if p.best and p.phase != "done"} <= fitting
    assert res.best.memory <= limit


def test_a_time_budget_ends_the_reports_early_but_still_with_done():
    m, x, y = _mlp(32)
    seen: list[SearchProgress] = []
    res = _search(m, x, y, method="exact", time_budget=1e-3, on_progress=seen.append)
    assert res.best_so_far and seen[-1].phase == "done" and seen[-1].fraction == 1.0
    assert seen[-2].done < seen[0].total  # the budget cut the plan short


def test_a_callback_that_is_not_callable_is_refused_before_any_work():
    m, x, y = _mlp()
    with pytest.raises(SearchError, match="on_progress must be a function"):
        _search(m, x, y, on_progress="bar")


def test_an_exception_in_the_callback_ends_the_search_with_it():
    m, x, y = _mlp()

    def stop(p: SearchProgress) -> None:
        if p.phase == "meshes":
            raise KeyboardInterrupt("stopped by the person watching")

    with pytest.raises(KeyboardInterrupt, match="stopped"):
        _search(m, x, y, method="cd", on_progress=stop)
