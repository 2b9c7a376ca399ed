"""Strategies carry no device: presets and search results compile for cpu or cuda (plans that differ only in
device and backend), a step compiled device-free takes the device of the cluster that runs it, and the
simulator prices it on the Hardware's device. Also: every SbplabError class is on ``sl``, and
``sl.search`` is both the function and the importable package."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest
import torch

import sbplab as sl
from sbplab.compiler.deduction.strategy import bind_device
from sbplab.compiler.reference import torch_steps
from sbplab.errors import SbplabError
from sbplab.runtime.comm import backend_for
from sbplab.sim.firing_cost import device_of

H100 = sl.Hardware.h100_node()
CPU = sl.Hardware.cpu_box()
STEPS = 3


def _mlp():
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    (x,), y = m.example_batch(8)
    return m, x, y


def _compile(m, x, y, strategy, device=None, hardware=None):
    """What ``sl.compile(..., device=device)`` does: bind the strategy's device, then compile."""
    return sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=bind_device(strategy, device), hardware=hardware)


def _norm(v, seen: set):
    """``v`` with every Placement unbound (the devices met go to ``seen``) and tensors as values."""
    if isinstance(v, sl.Placement):
        seen.add(v.device_type)
        return v.unbound()
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype), v.tolist())
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__name__, tuple((f.name, _norm(getattr(v, f.name), seen)) for f in dataclasses.fields(v)))
    if isinstance(v, dict):
        return tuple((k, _norm(x, seen)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x, seen) for x in v)
    return v


def _device_free_view(plan) -> tuple[tuple, set]:
    """Everything in ``plan`` but its device, and the device types its placements name."""
    seen: set = set()
    body = (plan.world_size, plan.micro_batches, plan.comm_order, plan.name, plan.imports,
            tuple((r, _norm(rp.actors, seen)) for r, rp in plan.ranks.items()))
    return body, seen


def _assert_plans_differ_only_in_device(strategy, hardware):
    m, x, y = _mlp()
    plans = {dev: _compile(m, x, y, strategy, dev, hardware).plan() for dev in ("cpu", "cuda", None)}
    assert {dev: p.device_type for dev, p in plans.items()} == {"cpu": "cpu", "cuda": "cuda", None: None}
    assert (backend_for(plans["cpu"].device_type), backend_for(plans["cuda"].device_type)) == ("gloo", "nccl")
    views = {dev: _device_free_view(p) for dev, p in plans.items()}
    assert views["cpu"][0] == views["cuda"][0] == views[None][0]
    assert (views["cpu"][1], views["cuda"][1], views[None][1]) == ({"cpu"}, {"cuda"}, {None})
    assert strategy.device_type is None  # binding made new strategies; the device-free one stays so


# --- placements and strategies ---------------------------------------------------------------------
def test_a_placement_may_leave_its_device_unbound():
    free = sl.Placement(None, [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    assert free == sl.Placement("any", [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    assert free == sl.Placement(ranks=[[0, 1], [2, 3]], axis_names=("dp", "tp"))
    assert not free.bound and free.device_type is None and repr(free).startswith("Placement(None, ")
    cuda = free.bind("cuda")
    assert cuda == sl.Placement("cuda", [[0, 1], [2, 3]], axis_names=("dp", "tp")) and cuda.bound
    assert cuda.bind("cuda") is cuda and free.bind(None) is free and cuda.unbound() == free
    with pytest.raises(sl.InputError, match="is for cuda, not cpu"):
        cuda.bind("cpu")
    with pytest.raises(sl.InputError, match="device_type must be one of"):
        free.bind("tpu")
    written = sl.Placement("cpu", [0, 1])  # as written by users: unchanged
    assert written.device_type == "cpu" and written.bound and repr(written) == "Placement('cpu', [0, 1])"


def test_presets_and_as_mesh_are_device_free_and_keep_a_written_device():
    assert sl.presets.data_parallel(2).placement.device_type is None
    assert sl.presets.dp_tp((2, 2)).placement == sl.Placement(None, [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    assert sl.presets.zero(sl.Placement("cuda", 4)).placement.device_type == "cuda"
    pipe = sl.presets.pipeline(2, 2)
    assert pipe.device_type is None and [p.device_type for p in pipe.stages] == [None, None]
    cuda_pipe = sl.presets.pipeline(2, 2, ranks_per_stage=2, inner="dp", device_type="cuda")  # was impossible
    assert cuda_pipe.device_type == "cuda" and cuda_pipe.stages[1] == sl.Placement("cuda", [2, 3])


def test_bind_device_binds_a_copy_and_refuses_another_device():
    st = sl.presets.pipeline(2, 2)
    cuda = bind_device(st, "cuda")
    assert cuda is not st and cuda.device_type == "cuda" and st.device_type is None
    assert [p.device_type for p in cuda.placements] == ["cuda"] * 3
    assert cuda.name == st.name and cuda.hints == st.hints and cuda.hints is not st.hints
    assert bind_device(st, None) is st and bind_device(cuda, "cuda") is cuda
    with pytest.raises(sl.InputError, match="places ops on cuda, so it cannot be compiled for cpu"):
        bind_device(cuda, "cpu")
    with pytest.raises(sl.InputError, match="device must be one of"):
        bind_device(st, "tpu")
    with pytest.raises(sl.InputTypeError):
        bind_device("dp", "cpu")
    # a device written on one placement binds the device-free rest of its strategy
    mixed = sl.Strategy(sl.Placement("cpu", [0]), stages=[sl.Placement("cpu", [0]), sl.Placement(None, [1])])
    assert mixed.device_type == "cpu" and mixed.stages[1] == sl.Placement("cpu", [1])


# --- plans: compiled for cpu, for cuda and device-free (no GPU needed: plans only) -------------------
def test_a_preset_compiles_for_cpu_and_cuda_to_plans_that_differ_only_in_device():
    _assert_plans_differ_only_in_device(sl.presets.dp_tp((1, 2)), CPU)


def test_a_pipeline_preset_compiles_for_cuda():
    m, x, y = _mlp()
    step = _compile(m, x, y, sl.presets.pipeline(2, 2), "cuda", CPU)
    assert step.plan().device_type == "cuda" and step.strategy.stages[1] == sl.Placement("cuda", [1])


def test_a_search_result_compiles_for_cpu_and_cuda_to_plans_that_differ_only_in_device():
    m, x, y = _mlp()
    res = sl.search(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), devices=2, hardware=H100,
                    method="cd", pipelines=False, rerank_top=0)
    assert res.strategy.device_type is None and res.strategy.signatures  # searched signatures, no device
    _assert_plans_differ_only_in_device(res.strategy, H100)


# --- the simulator: a device-free step runs on the Hardware's device -----------------------------------
def test_the_simulator_prices_a_device_free_step_on_the_hardware_device():
    assert (device_of(CPU), device_of(H100)) == ("cpu", "cuda")
    key = ("relu", ((4,),), "float32", "cuda")
    assert device_of(dataclasses.replace(CPU, op_times=((key, 1e-6),))) == "cuda"  # measured there
    m, x, y = _mlp()
    st = sl.presets.data_parallel(2)
    for hw, dev in ((CPU, "cpu"), (H100, "cuda")):
        free = sl.simulate(_compile(m, x, y, st, None, hw), hw)
        bound = sl.simulate(_compile(m, x, y, st, dev, hw), hw)
        assert free.step_time == bound.step_time and free.peak_memory == bound.peak_memory


def test_eager_tensors_on_a_device_free_placement_live_on_this_cpu():
    a = sl.tensor(torch.arange(8.0).reshape(4, 2), placement=sl.Placement(None, [0, 1]), sbp="S(0)")
    b = a.to_global(placement=sl.Placement(None, [2, 3]), sbp="B")  # a move between placements, in process
    assert all(s.device.type == "cpu" for s in b.shards.values())
    assert torch.equal(b.full(), torch.arange(8.0).reshape(4, 2))


# --- runs: on 2 Gloo ranks, the cpu step and the device-free one train like torch -------------------
@pytest.mark.multiprocess
def test_cpu_and_device_free_steps_run_on_a_cpu_cluster_and_a_cuda_step_does_not():
    m, x, y = _mlp()
    ref, _ = torch_steps(m, (x,), target=y, loss_fn=m.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS)
    st = sl.presets.data_parallel(2)
    cpu_step, free_step = _compile(m, x, y, st, "cpu"), _compile(m, x, y, st)
    cuda_step = _compile(m, x, y, st, "cuda")
    with sl.LocalCluster(2) as cluster:
        with pytest.raises(sl.InputError, match="is for cuda but this cluster runs cpu; compile it for 'cpu'"):
            cluster.run(cuda_step, (x, y), steps=STEPS)
        for step in (cpu_step, free_step):
            res = cluster.run(step, (x, y), steps=STEPS)
            assert res.losses == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert free_step.plan().device_type is None  # the cluster bound a copy of the plan, not the step's own


# --- errors exported, search importable -------------------------------------------------------------
def _error_classes() -> set[type]:
    out, todo = set(), [SbplabError]
    while todo:
        cls = todo.pop()
        out.add(cls)
        todo += cls.__subclasses__()
    return {c for c in out if c.__module__.startswith("sbplab.")}


def test_every_sbplab_error_class_is_exported():
    import pkgutil

    for mod in pkgutil.walk_packages(sl.__path__, "sbplab."):  # every module, so every class is defined
        if not mod.name.startswith(("sbplab.widgets", "sbplab.worker", "sbplab.demo", "sbplab.tour")):
            __import__(mod.name)
    classes = _error_classes()
    assert {"RunError", "SearchError", "SimulationError", "PlanError", "LayoutError", "BoxingError"} <= \
        {c.__name__ for c in classes}
    missing = sorted(c.__name__ for c in classes if getattr(sl, c.__name__, None) is not c)
    assert not missing, f"not exported from sbplab: {missing}"
    assert not sorted(c.__name__ for c in classes if c.__name__ not in sl.__all__)


def test_sl_search_is_the_function_and_the_package_stays_importable():
    assert callable(sl.search)
    assert list(inspect.signature(sl.search).parameters)[:3] == ["model", "inputs", "target"]
    code = ("import sbplab.search.cost\nimport sbplab as sl\nfrom sbplab.search import cost, mesh\n"
            "from sbplab.search.search_api import search\n"
            "assert sl.search.cost is cost and sl.search.search is search and callable(sl.search)\n"
            "print(cost.Pricer.__name__, mesh.MeshChoice.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Pricer", "MeshChoice"]
    m, x, y = _mlp()  # calling the package calls the function
    res = sl.search(m, (x,), loss_fn=m.loss_fn, target=y, devices=2, hardware=H100, method="cd", pipelines=False,
                    rerank_top=0)
    assert isinstance(res, sl.search.SearchResult)
