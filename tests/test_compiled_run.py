"""A compiled step runs with the user's plain inputs: ``cluster.run(step, (idx, targets))``.

``step.feeds`` names and checks them (tuple in graph-input order, dict by name, one tensor), and a
wrong count, name, shape or dtype is an error naming the input, before any worker is involved.
``step.plan`` gives the runtime its actor plan; the runtime takes any object with both methods.
"""

from __future__ import annotations

import pytest
import torch

import sbplab as sl
from sbplab.compiler.ir import GraphError
from sbplab.compiler.reference import torch_steps
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig, WideDeep, WideDeepConfig
from sbplab.runtime import ActorPlan, LocalCluster, Runnable
from sbplab.runtime.runnable import plan_and_batches


def _wide_deep(micro_batches: int = 1):
    """Three graph inputs (ids, dense, target) of two dtypes: order, names and dtypes all matter."""
    torch.manual_seed(0)
    m = WideDeep(WideDeepConfig(vocab_size=32, n_fields=2, emb_dim=4, n_dense=3, hidden=8))
    (ids, dense), y = m.example_batch(8)
    step = sl.compile(m, (ids, dense), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.data_parallel(2, micro_batches=micro_batches))
    return step, ids, dense, y


class _SquaredOutput(torch.nn.Module):
    """A module that returns its own loss: its step has a single input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return (y * y).mean()


@pytest.fixture(scope="module")
def wide_deep():
    return _wide_deep()


def test_a_tuple_is_taken_in_the_order_of_the_graph_inputs(wide_deep):
    step, ids, dense, y = wide_deep
    assert len(step.graph.inputs) == 3
    feeds = step.feeds((ids, dense, y))
    assert list(feeds) == step.graph.inputs
    assert [feeds[n] is t for n, t in zip(step.graph.inputs, (ids, dense, y))] == [True] * 3
    assert step.feeds([ids, dense, y]) == feeds


def test_a_dict_by_name_still_works(wide_deep):
    step, ids, dense, y = wide_deep
    by_name = dict(zip(reversed(step.graph.inputs), (y, dense, ids)))  # any key order
    feeds = step.feeds(by_name)
    assert list(feeds) == step.graph.inputs and all(feeds[n] is by_name[n] for n in by_name)


def test_one_tensor_feeds_a_step_with_one_input():
    x = torch.randn(6, 4)
    step = sl.compile(_SquaredOutput(), x, strategy=sl.presets.data_parallel(2))
    (name,) = step.graph.inputs
    assert step.feeds(x) == {name: x} and step.feeds((x,)) == {name: x}


def test_a_micro_batched_step_takes_the_whole_batch():
    step, ids, dense, y = _wide_deep(micro_batches=2)
    assert step.graph.tensors[step.graph.inputs[0]].shape[0] == 4  # traced on one micro-batch
    assert step.feeds((ids, dense, y))[step.graph.inputs[0]] is ids
    with pytest.raises(GraphError, match=r"a batch of 4 where the step was compiled for 8"):
        step.feeds((ids[:4], dense[:4], y[:4]))


@pytest.mark.parametrize("make,error,message", [
    (lambda ids, dense, y: (ids, dense), GraphError, r"2 input\(s\) given, but the compiled step takes 3"),
    (lambda ids, dense, y: ids, GraphError, r"one tensor given, but the compiled step takes 3 inputs"),
    (lambda ids, dense, y: {"ids": ids, "dens": dense, "target": y}, GraphError,
     r"unknown input 'dens' \(did you mean 'dense'\?\)"),
    (lambda ids, dense, y: {"ids": ids, "target": y}, GraphError, r"input 'dense' is missing"),
    (lambda ids, dense, y: (ids, dense, torch.cat([y, y])), GraphError,
     r"input 'target' has shape \(16,\) \(a batch of 16 where the step was compiled for 8\); "
     r"the compiled step takes \(8,\)"),
    (lambda ids, dense, y: (ids, dense[:, :2], y), GraphError, r"input 'dense' has shape \(8, 2\); .* \(8, 3\)"),
    (lambda ids, dense, y: (ids.int(), dense, y), GraphError,
     r"input 'ids' has dtype torch.int32; the compiled step takes torch.int64"),
    (lambda ids, dense, y: (ids, dense.tolist(), y), TypeError, r"input 'dense' must be a torch.Tensor"),
    (lambda ids, dense, y: None, GraphError, r"no inputs given; the compiled step takes ids \(8, 2\) int64"),
    (lambda ids, dense, y: "ids", TypeError, r"inputs must be a tensor, a tuple of tensors"),
], ids=["count", "one-for-three", "unknown-name", "missing-name", "batch-size", "shape", "dtype", "not-a-tensor",
        "none", "string"])
def test_bad_inputs_name_the_input_and_what_the_step_takes(wide_deep, make, error, message):
    step, ids, dense, y = wide_deep
    with pytest.raises(error, match=message):
        step.feeds(make(ids, dense, y))


def test_per_step_batches_are_checked_each(wide_deep):
    step, ids, dense, y = wide_deep
    ids2 = torch.randint(0, 32, ids.shape)
    per_step = step.feeds([(ids, dense, y), {"ids": ids2, "dense": dense, "target": y}])
    assert isinstance(per_step, list) and [b["ids"] for b in per_step] == [ids, ids2]
    with pytest.raises(GraphError, match=r"the batch of step 1: input 'ids' has dtype torch.int32"):
        step.feeds([(ids, dense, y), (ids.int(), dense, y)])
    with pytest.raises(GraphError, match=r"2 input\(s\) given, but the compiled step takes 3"):
        step.feeds([ids, (ids, dense, y)])  # a tensor and a batch: read as one batch
    fn = step.feeds(lambda s: (ids, dense, y) if s == 0 else (ids[:4], dense[:4], y[:4]))
    assert fn(0)["target"] is y
    with pytest.raises(GraphError, match=r"the batch of step 1: input 'ids' has shape \(4, 2\)"):
        fn(1)


def test_the_plan_is_lowered_once_per_arguments(wide_deep):
    step = wide_deep[0]
    plan = step.plan()
    assert isinstance(plan, ActorPlan) and plan.world_size == 2 and plan.name == step.strategy.name
    assert plan.imports == ()  # workers need no compiler: every kernel is registered by sbplab.ops
    assert step.plan() is plan
    wider = step.plan(world_size=4)
    assert wider is not plan and wider.world_size == 4 and not wider.ranks[3].actors
    assert step.plan(registers=1, order="compiler") is not step.plan(registers=1)


def test_the_runtime_takes_any_runnable_and_refuses_anything_else(wide_deep):
    step, ids, dense, y = wide_deep
    assert isinstance(step, Runnable)
    plan, batches = plan_and_batches(step, (ids, dense, y), 4)
    assert plan is step.plan(world_size=4) and list(batches) == step.graph.inputs
    same = ActorPlan.build(1, {0: []})
    assert plan_and_batches(same, {"x": ids}, 4) == (same, {"x": ids})  # a plan's batches pass as given
    with pytest.raises(TypeError, match=r"run needs an ActorPlan or a compiled step .*got Graph"):
        plan_and_batches(step.graph, None, 2)

    class NotAPlan:
        def plan(self, world_size=None):
            return "plan"

        def feeds(self, inputs):
            return {}

    with pytest.raises(TypeError, match=r"NotAPlan.plan\(world_size=2\) returned str, not an ActorPlan"):
        plan_and_batches(NotAPlan(), None, 2)


def test_run_checks_before_any_worker_is_needed(wide_deep):
    """Bad inputs and a wrong type fail at once, on a cluster that has no workers at all."""
    step, ids, dense, y = wide_deep
    with LocalCluster(2, launch="external", start_timeout=1.0) as cluster:
        with pytest.raises(TypeError, match="run needs an ActorPlan or a compiled step"):
            cluster.run(step.physical, (ids, dense, y))
        with pytest.raises(GraphError, match="input 'target' has shape"):
            cluster.run(step, (ids, dense, y[:4]))


@pytest.mark.multiprocess
def test_run_with_plain_inputs_matches_single_device_torch():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16))
    (idx,), targets = model.example_batch(4)
    optimizer = sl.SGD(lr=0.1, momentum=0.9)
    step = sl.compile(model, (idx,), loss_fn=GPT.loss_fn, target=targets, optimizer=optimizer,
                      strategy=sl.presets.dp_tp((2, 2)))
    ref_losses, ref_params = torch_steps(model, (idx,), target=targets, loss_fn=GPT.loss_fn, optimizer=optimizer, steps=3)
    with sl.LocalCluster(4) as cluster:
        result = cluster.run(step, (idx, targets), steps=3, progress=False)
        # a micro-batched MLP fed per step, on the same workers (two of the four idle)
        mlp = MLP(MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
        batches = [mlp.example_batch(8, seed=s) for s in range(2)]
        mstep = sl.compile(mlp, batches[0][0], loss_fn=mlp.loss_fn, target=batches[0][1], optimizer=sl.SGD(lr=0.1),
                           strategy=sl.presets.data_parallel(2, micro_batches=2))
        mres = cluster.run(mstep, [(*xs, t) for xs, t in batches], steps=2, progress=False)
    assert result.losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    for name, p in ref_params.items():
        assert torch.allclose(result.params[name].full(), p, atol=1e-4), name
    ref = MLP(MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    ref.load_state_dict(mlp.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    want = []
    for (x,), t in batches:
        loss = mlp.loss_fn(ref(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert mres.losses == pytest.approx(want, rel=1e-4, abs=1e-5)
