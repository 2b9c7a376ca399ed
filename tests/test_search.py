"""sl.search: the methods agree on small graphs, the result is an ordinary Strategy that compiles to the
chosen signatures and trains like torch, and bad requests fail before any search work."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import sbplab as sl
from sbplab.compiler.reference import compare, torch_steps
from sbplab.search import SearchError, search
from sbplab.search.clock import Clock
from sbplab.search.mesh import mesh_choices
from sbplab.search.solve import solve_space

H100 = sl.Hardware.h100_node()


def _mlp(n_blocks: int = 1, batch: int = 16, **kw):
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(n_blocks=n_blocks, **kw))
    (x,), y = m.example_batch(batch)
    return m, x, y


def _search(m, x, y, **kw):
    kw.setdefault("optimizer", sl.SGD(lr=0.1))
    kw.setdefault("rerank_top", 0)
    return search(m, (x,), loss_fn=m.loss_fn, target=y, **kw)


@pytest.mark.parametrize("devices,n_blocks", [(2, 1), (4, 0)])
def test_exact_equals_exhaustive_on_small_graphs(devices, n_blocks):
    m, x, y = _mlp(n_blocks, in_dim=8, width=16, hidden=32)
    res = {meth: _search(m, x, y, devices=devices, hardware=H100, method=meth, pipelines=False, reduce=False)
           for meth in ("exhaustive", "exact")}
    fwd = len(res["exact"].best.problem.ops)
    assert fwd <= 8
    assert res["exact"].best.step_time == pytest.approx(res["exhaustive"].best.step_time, rel=1e-9)
    # and space by space (every mesh, every ZeRO level), not only the overall winner
    space = res["exact"].candidates
    for c in space:
        clock = Clock()
        ex, _ = solve_space(c.problem, c.zero, "exhaustive", None, clock, [], reduce=False)
        ilp, _ = solve_space(c.problem, c.zero, "exact", None, clock, [], reduce=False)
        assert c.problem.cost(ilp, c.zero) == pytest.approx(c.problem.cost(ex, c.zero), rel=1e-9)


ZOO = {"mlp": (sl.models.MLP, sl.models.MLPConfig(n_blocks=2)), "gpt": (sl.models.GPT, sl.models.GPTConfig(n_layer=2)),
       "cnn": (sl.models.CNN, sl.models.CNNConfig()), "wide_deep": (sl.models.WideDeep, sl.models.WideDeepConfig())}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_cd_and_mcmc_reach_within_5_percent_of_exact_on_the_zoo(name):
    torch.manual_seed(0)
    cls, cfg = ZOO[name]
    m = cls(cfg)
    xs, y = m.example_batch(64)
    kw = dict(loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), devices=8, hardware=H100, pipelines=False,
              rerank_top=0)
    exact = search(m, xs, method="exact", **kw)
    for meth in ("cd", "mcmc"):
        r = search(m, xs, method=meth, seed=1, **kw)
        assert r.best.step_time <= exact.best.step_time * 1.05, (name, meth, r.table())


@pytest.mark.parametrize("hw", [H100, sl.Hardware.cpu_box()], ids=["h100", "cpu"])
def test_searched_never_predicts_worse_than_the_best_preset(hw):
    m, x, y = _mlp(2, batch=32, width=64, hidden=256)
    res = _search(m, x, y, devices=4, hardware=hw)
    best_preset = res.best_preset()
    assert best_preset is not None and len(res.presets) >= 4
    assert res.best.step_time <= best_preset.step_time * (1 + 1e-9)
    table = res.table()
    for p in res.presets:
        assert p.describe() in table
    assert "best preset" in res.explain()


def test_unmeetable_memory_limit_reports_the_least_memory_needed():
    m, x, y = _mlp(1)
    with pytest.raises(SearchError, match="least memory any strategy needs is") as e:
        _search(m, x, y, devices=4, hardware=H100, memory_limit=1, pipelines=False)
    need = int(str(e.value).split("needs is ")[1].split(" B")[0])
    assert need > 1
    ok = _search(m, x, y, devices=4, hardware=H100, memory_limit=need, pipelines=False)  # exactly enough is enough
    assert ok.best.memory <= need
    with pytest.raises(SearchError, match="least memory"):
        _search(m, x, y, devices=4, hardware=H100, memory_limit=need - 1, pipelines=False)


class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x)


@pytest.mark.parametrize("devices", [0, -2, 2.5, "8", True])
def test_bad_device_counts_fail_before_any_work(devices):
    m = _Counting()
    with pytest.raises(SearchError, match="devices must be a positive int"):
        search(m, (torch.randn(4, 4),), loss_fn=nn.functional.mse_loss, target=torch.randn(4, 4), devices=devices)
    assert m.calls == 0


def test_bad_arguments_are_clear_errors():
    m, x, y = _mlp(0)
    with pytest.raises(SearchError, match="method must be one of"):
        _search(m, x, y, devices=2, method="genetic")
    with pytest.raises(SearchError, match="memory_limit"):
        _search(m, x, y, devices=2, memory_limit=-5)
    with pytest.raises(SearchError, match="hardware must be an sl.Hardware"):
        _search(m, x, y, devices=2, hardware="h100")


class _Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.fft.fft(self.fc(x)).real


def test_unsupported_op_is_a_clear_error_before_search():
    """sbplab's own op library has no fft: capture='fx' says so before searching. The default capture
    takes the model at ATen level instead, where fft has no SBP rule and runs whole on every rank."""
    with pytest.raises(SearchError, match="cannot be compiled") as e:
        search(_Unsupported(), (torch.randn(4, 4),), loss_fn=nn.functional.mse_loss, target=torch.randn(4, 4),
               devices=2, capture="fx")
    assert "fft" in str(e.value)
    with pytest.warns(sl.ReplicatedOpWarning, match="fft"):
        res = search(_Unsupported(), (torch.randn(4, 4),), loss_fn=nn.functional.mse_loss, target=torch.randn(4, 4),
                     devices=2, method="cd")
    assert res.best.step_time < math.inf


def test_a_time_budget_that_runs_out_returns_the_best_so_far_marked():
    m, x, y = _mlp(2, batch=32)
    res = _search(m, x, y, devices=8, hardware=H100, method="exact", time_budget=1e-3)
    assert res.best_so_far
    assert "best so far" in res.table()
    assert res.best.step_time < math.inf
    full = _search(m, x, y, devices=8, hardware=H100, method="cd", pipelines=False)
    assert not full.best_so_far


def test_the_result_compiles_to_the_chosen_signatures_and_trains_like_torch():
    m, x, y = _mlp(2, batch=32, in_dim=32, width=128, hidden=512)
    opt = sl.Adam(lr=0.01)
    res = search(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, devices=4, hardware=sl.Hardware.cpu_box(),
                 rerank_top=2)
    assert isinstance(res.strategy, sl.Strategy)
    assert res.predicted.source == "simulator"
    assert res.predicted.step_time > 0
    # the winner and a pipelined, a ZeRO and a 2-D candidate all compile to their searched signatures
    picks = [res.best]
    for want in (lambda c: c.n_stages > 1, lambda c: c.zero > 0, lambda c: len(c.mesh.shape) == 2):
        picks += [c for c in res.candidates if want(c)][:1]
    assert len(picks) == 4
    for c in picks:
        cmp = compare(m, (x,), target=y, loss_fn=m.loss_fn, optimizer=opt, strategy=c.strategy, steps=2)
        got = {n: cmp.compiled.deduction.choices[n].signature for n in c.signatures}
        assert got == c.signatures, c.describe()
        assert cmp.losses == pytest.approx(cmp.ref_losses, rel=1e-4, abs=1e-5), c.describe()
        assert max(cmp.param_err.values()) < 1e-3, c.describe()
        assert cmp.compiled.strategy.n_stages == c.n_stages
        assert cmp.compiled.strategy.micro_batches == c.micro_batches


def test_the_2d_mesh_axes_map_to_the_hardware_links():
    choices = mesh_choices(64, sl.Hardware.h100_ib(8))
    eight = [c for c in choices if c.shape == (8, 8)]
    assert {c.links for c in eight} == {(0, 1), (1, 0)}
    for c in choices:
        inner = [a for a, k in enumerate(c.links) if k == 1]
        assert all(8 % c.shape[a] == 0 for a in inner)  # an NVLink axis fits inside a node
        pl = c.placement()
        for a in inner:  # and holds consecutive ranks
            g = pl.groups(a)[0]
            assert max(g) - min(g) == len(g) - 1
    # a mesh that fits in one node (a pipeline stage) never crosses the slow link, whichever its shape
    stage = mesh_choices(8, sl.Hardware.h100_ib(8))
    assert {c.shape: c.links for c in stage} == {(8,): (1,), (2, 4): (1, 1), (4, 2): (1, 1)}
    assert len(stage) == 3
    with pytest.raises(SearchError):
        mesh_choices(0, H100)


def test_plot_draws_best_cost_against_search_time():
    pytest.importorskip("plotly")
    m, x, y = _mlp(1)
    res = _search(m, x, y, devices=2, hardware=H100, method="cd")
    fig = res.plot()
    names = {t.name for t in fig.data}
    assert "cd" in names
    for t in fig.data:
        assert list(t.x) == sorted(t.x)
        assert all(v > 0 for v in t.y)


def test_gpt_search_reduces_layers_and_stays_consistent():
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(n_layer=2))
    (idx,), y = m.example_batch(8)
    res = search(m, (idx,), loss_fn=m.loss_fn, target=y, devices=4, hardware=H100, method="exact",
                 pipelines=False, rerank_top=0)
    best = res.best
    # ties layers: every block's q projection takes the same signature
    qs = {s for n, s in best.signatures.items() if n.endswith("attn.q")}
    assert len(qs) == 1
    assert best.step_time == pytest.approx(best.problem.cost(best.assign, best.zero))
    assert best.step_time <= res.best_preset().step_time * (1 + 1e-9)


@pytest.mark.multiprocess
def test_searched_strategy_runs_on_two_workers_like_torch():
    m, x, y = _mlp(2, batch=16)
    opt = sl.SGD(lr=0.1)
    res = search(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, devices=2, hardware=sl.Hardware.cpu_box())
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=opt, strategy=res.strategy)
    with sl.LocalCluster(2) as cluster:
        run = cluster.run(step, dict(zip(step.graph.inputs, (x, y))), steps=3, progress=False)
    ref, _ = torch_steps(m, (x,), target=y, loss_fn=m.loss_fn, optimizer=opt, steps=3)
    assert run.losses == pytest.approx(ref, rel=1e-4, abs=1e-5)
