"""Parameters and optimizer state stay with the cluster between runs of the same compiled step.

Two runs of 3 steps train like one run of 6 (losses and final parameters, and both like plain
single-device PyTorch), for SGD with momentum and for Adam, data parallel on 2 ranks; ``restart=True``
and ``cluster.reset(step)`` start again from the compiled weights; another compiled step starts from
its own; a failed run keeps the state of the last finished one, even across respawned workers; and
``result.load_into(model)`` hands the trained weights back to the torch module.
"""

from __future__ import annotations

import copy

import pytest
import torch

import sbplab as sl
from sbplab.compiler.reference import torch_steps

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


def _model():
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    (x,), y = m.example_batch(8)
    return m, x, y


OPTIMIZERS = {"sgd_momentum": lambda: sl.SGD(lr=0.1, momentum=0.9), "adam": lambda: sl.Adam(lr=0.01)}


def _compile(model, x, y, opt):
    return sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=opt,
                      strategy=sl.presets.data_parallel(2))


def _same_params(a, b) -> None:
    assert set(a.params) == set(b.params) and len(a.params) > 8  # the optimizer state is there too
    for name in a.params:  # parameters and optimizer state alike
        assert torch.equal(a.params[name].full(), b.params[name].full()), name


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_two_runs_of_3_steps_equal_one_run_of_6_and_torch(cluster, opt):
    model, x, y = _model()
    optimizer = OPTIMIZERS[opt]()
    step = _compile(model, x, y, optimizer)
    first = cluster.run(step, (x, y), steps=3, progress=False)
    assert cluster.has_state(step)
    second = cluster.run(step, (x, y), steps=3, progress=False)
    assert second.losses != first.losses  # it went on training
    six = cluster.run(step, (x, y), steps=6, progress=False, restart=True)
    assert six.losses[:3] == first.losses  # restart: the first run again, to the bit
    assert first.losses + second.losses == six.losses  # the state comes back exactly as it was
    _same_params(second, six)
    want, want_params = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=optimizer, steps=6)
    assert first.losses + second.losses == pytest.approx(want, rel=1e-4, abs=1e-5)
    for name, p in want_params.items():
        assert torch.allclose(second.params[name].full(), p, atol=1e-4), name


def test_reset_and_another_step_start_from_their_compiled_weights(cluster):
    model, x, y = _model()
    opt = sl.SGD(lr=0.1, momentum=0.9)
    step = _compile(model, x, y, opt)
    want, _ = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=opt, steps=4)
    assert cluster.run(step, (x, y), steps=2, progress=False).losses == pytest.approx(want[:2], rel=1e-4)
    other = _compile(model, x, y, opt)  # the same module compiled again: a step of its own
    assert not cluster.has_state(other)
    assert cluster.run(other, (x, y), steps=2, progress=False).losses == pytest.approx(want[:2], rel=1e-4)
    assert cluster.run(step, (x, y), steps=2, progress=False).losses == pytest.approx(want[2:], rel=1e-4)
    cluster.reset(step)
    assert not cluster.has_state(step) and cluster.has_state(other)
    assert cluster.run(step, (x, y), steps=2, progress=False).losses == pytest.approx(want[:2], rel=1e-4)
    # params=False still continues (the shards come back, the globals are not assembled)
    quiet = cluster.run(step, (x, y), steps=2, progress=False, params=False)
    assert quiet.params == {} and quiet.losses == pytest.approx(want[2:], rel=1e-4)
    # an ActorPlan given directly starts from its States' init every run, as it always did
    plan, feeds = step.plan(world_size=2), step.feeds((x, y))
    a = cluster.run(plan, feeds, steps=2, progress=False)
    b = cluster.run(plan, feeds, steps=2, progress=False)
    assert a.losses == b.losses == pytest.approx(want[:2], rel=1e-4)
    with pytest.raises(sl.SbplabError, match="restart must be True or False"):
        cluster.run(step, (x, y), restart="yes")


def test_a_failed_run_keeps_the_last_finished_state_across_respawned_workers(cluster):
    model, x, y = _model()
    opt = sl.Adam(lr=0.01)
    step = _compile(model, x, y, opt)
    want, want_params = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=opt, steps=6)
    cluster.run(step, (x, y), steps=3, progress=False)
    pids = cluster.pids

    def boom(s, steps, loss):
        raise KeyboardInterrupt("stop")  # like Ctrl-C in the middle of a run: the workers are torn down

    with pytest.raises(KeyboardInterrupt):
        cluster.run(step, (x, y), steps=50, progress=False, on_step=boom)
    res = cluster.run(step, (x, y), steps=3, progress=False)
    assert set(cluster.pids).isdisjoint(pids)  # fresh workers, the same state
    assert res.losses == pytest.approx(want[3:], rel=1e-4, abs=1e-5)
    for name, p in want_params.items():
        assert torch.allclose(res.params[name].full(), p, atol=1e-4), name


def test_load_into_gives_the_torch_module_the_trained_weights(cluster):
    model, x, y = _model()
    before = copy.deepcopy(model.state_dict())
    step = _compile(model, x, y, sl.SGD(lr=0.1, momentum=0.9))
    res = cluster.run(step, (x, y), steps=3, progress=False)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the run did not touch it
    loaded = res.load_into(model)
    assert sorted(loaded) == sorted(n for n, _ in model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), res.params[name].full()), name
    with torch.no_grad():
        torch_loss = model.loss_fn(model(x), y).item()
    nxt = cluster.run(step, (x, y), steps=1, progress=False)
    assert nxt.losses[0] == pytest.approx(torch_loss, rel=1e-5, abs=1e-6)
    # a module of another shape, or a result without parameters, is refused by name
    with pytest.raises(sl.SbplabError, match="blocks.0.fc1.weight.*shape"):
        res.load_into(sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=32, n_blocks=1, n_classes=4)))
    with pytest.raises(sl.SbplabError, match="no parameter of this Linear"):
        res.load_into(torch.nn.Linear(2, 2))
    quiet = cluster.run(step, (x, y), steps=1, progress=False, params=False)
    with pytest.raises(sl.SbplabError, match="params=False"):
        quiet.load_into(model)


def test_one_copy_of_each_replicated_state_comes_back():
    """A State that is B on a mesh axis is the same on the ranks along it: only the first sends it."""
    from sbplab.runtime import State
    from sbplab.runtime.results import replica_sources

    model, x, y = _model()
    for strategy, ranks in ((sl.presets.dp_tp((2, 2)), 4), (sl.presets.zero(2), 2), (sl.presets.data_parallel(2), 2)):
        step = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=sl.Adam(lr=0.01), strategy=strategy)
        plan = step.plan(world_size=ranks)
        copies = replica_sources(plan)
        states = {(r, a.name): a for r, rp in plan.ranks.items() for a in rp.actors if isinstance(a, State) and a.key}
        for (r, name), (q, src) in copies.items():
            a, b = states[(r, name)], states[(q, src)]
            assert a.key == b.key and q < r and a.init.shape == b.init.shape
            axes = [i for i, (c, d) in enumerate(zip(a.placement.coords(r), a.placement.coords(q))) if c != d]
            assert axes and all(isinstance(a.sbp[i], sl.sbp.Broadcast) for i in axes)
        senders = set(states) - set(copies)
        assert {states[k].key for k in senders} == {a.key for a in states.values()}  # every key still comes back
        if strategy.name.startswith("data parallel"):
            assert len(copies) == len(senders)  # rank 1 sends nothing
        if "ZeRO" in strategy.name or "zero" in strategy.name.lower():
            assert all(states[k].key == "adam.step" for k in copies)  # sharded state: no copies


def test_tensor_parallel_runs_continue_too(cluster):
    """Split and replicated parameters (tensor parallel on 2 ranks) come back and go on training."""
    model, x, y = _model()
    opt = sl.SGD(lr=0.1, momentum=0.9)
    step = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, optimizer=opt,
                      strategy=sl.presets.tensor_parallel(2))
    first = cluster.run(step, (x, y), steps=2, progress=False)
    second = cluster.run(step, (x, y), steps=2, progress=False)
    want, want_params = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=opt, steps=4)
    assert first.losses + second.losses == pytest.approx(want, rel=1e-4, abs=1e-5)
    for name, p in want_params.items():
        assert torch.allclose(second.params[name].full(), p, atol=1e-4), name


def test_the_same_workers_continue_from_what_they_keep_and_others_get_the_drivers_copy(cluster):
    """Run after run of one step on the same workers, the driver ships no state: the workers start from
    the final values they kept. After another plan ran there, the driver ships its copy instead."""
    from sbplab.runtime import State

    model, x, y = _model()
    opt = sl.Adam(lr=0.01)
    step = _compile(model, x, y, opt)
    want, _ = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=opt, steps=6)
    shipped = []

    def spy(plan, batches, opts):
        inits = [a.init for rp in plan.ranks.values() for a in rp.actors if isinstance(a, State) and a.key]
        shipped.append((opts.resume, sum(isinstance(i, torch.Tensor) for i in inits), len(inits)))
        return real(plan, batches, opts)

    cluster.run(step, (x, y), steps=2, progress=False)  # (re)starts the workers if needed
    real = cluster.driver.run
    cluster.driver.run = spy
    try:
        second = cluster.run(step, (x, y), steps=2, progress=False)
        cluster.run(step.plan(world_size=2), step.feeds((x, y)), steps=1, progress=False)  # the workers let it go
        third = cluster.run(step, (x, y), steps=2, progress=False)
    finally:
        del cluster.driver.run
    (resume, tensors, n), _, (resume3, tensors3, n3) = shipped
    assert resume is not None and tensors == 0 and n > 0  # Zeros descriptions only: nothing shipped
    assert resume3 is None and tensors3 == n3  # the driver's copy, every State
    assert second.losses + third.losses == pytest.approx(want[2:], rel=1e-4, abs=1e-5)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight  # one parameter, two names
        self.frozen = torch.nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.register_buffer("running", torch.zeros(4))  # state a forward would update (BatchNorm's statistics)

    def forward(self, x):
        return self.frozen(self.b(self.a(x)))


def test_load_into_finds_a_tied_parameter_under_either_name_and_leaves_frozen_ones():
    """Names are the module's; a buffer the step updates is loaded too; frozen parameters stay."""
    from sbplab.runtime import RunResult

    m = _Tied()
    frozen = m.frozen.weight.detach().clone()
    value = {n: torch.full_like(p, 7.0) for n, p in m.named_parameters() if n != "a.weight"}
    value["b.weight"] = torch.full((4, 4), 3.0)  # the run names the tied weight by its second name
    value = {k: v for k, v in value.items() if not k.startswith("frozen")}
    value["running"] = torch.ones(4)
    loaded = RunResult(params=value).load_into(m)
    assert sorted(loaded) == ["a.bias", "b.bias", "b.weight", "running"]
    assert torch.equal(m.running, torch.ones(4))
    assert torch.equal(m.a.weight.detach(), torch.full((4, 4), 3.0)) and m.a.weight is m.b.weight
    assert torch.equal(m.frozen.weight, frozen)
    del value["b.bias"]
    with pytest.raises(sl.SbplabError, match=r"no value for trainable parameter\(s\) \['b.bias'\]"):
        RunResult(params=value).load_into(m)
    assert RunResult(params=value).load_into(m, strict=False) == ["a.bias", "b.weight", "running"]


def test_a_bad_batch_is_refused_on_the_driver_without_losing_the_workers_or_the_state(cluster):
    """A target of the wrong shape or dtype, or holding a class the model does not have, never reaches a
    worker: the same workers and the kept state carry on."""
    model, x, y = _model()
    opt = sl.SGD(lr=0.1, momentum=0.9)
    step = _compile(model, x, y, opt)
    want, _ = torch_steps(model, (x,), target=y, loss_fn=model.loss_fn, optimizer=opt, steps=4)
    cluster.run(step, (x, y), steps=2, progress=False)
    pids = cluster.pids
    for bad in (y[:4], y.float()):
        with pytest.raises(sl.SbplabError, match="input 'target' has"):
            cluster.run(step, (x, bad), steps=1, progress=False)
    out_of_range = y.clone()
    out_of_range[-1] = 100
    with pytest.raises(sl.SbplabError, match=r"input 'target' holds 100 at index \(\d+,\), but .* valid values are 0\.\."):
        cluster.run(step, (x, out_of_range), steps=1, progress=False)
    assert cluster.alive and cluster.pids == pids
    assert cluster.run(step, (x, y), steps=2, progress=False).losses == pytest.approx(want[2:], rel=1e-4, abs=1e-5)
    assert cluster.pids == pids
