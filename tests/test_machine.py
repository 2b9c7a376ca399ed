"""Machine: nodes x devices, link levels and a device model apart from any mesh; presets, files, achievable
efficiency, links from ranks, and the search's prediction equal to the user's machine's."""

from __future__ import annotations

import json

import pytest
import torch

import sbplab as sl
from sbplab.hardware import op_key
from sbplab.machine_device import kernel_class
from sbplab.search.mesh import mesh_choices
from sbplab.sim.engine import COMM


def test_presets_carry_peaks_per_dtype_memory_and_levels():
    a, h = sl.Machine.a100_cluster(4), sl.Machine.h100_node()
    assert isinstance(a, sl.Hardware) and a.devices == 32 and a.nodes == 4 and h.devices == 8
    assert a.flops_for(torch.bfloat16) == pytest.approx(312e12) and a.flops_for(torch.float32) == pytest.approx(19.5e12)
    assert a.device.peak("tf32") == pytest.approx(156e12) and h.device.peak("fp16") == pytest.approx(989.4e12)
    assert a.memory_bytes == 80 * 2**30 == h.memory_bytes
    nv, ib = a.levels[-1], a.levels[0]
    assert nv.bandwidth < 300e9 and ib.bandwidth < 25e9  # achievable, below the datasheets' 300 and 25 GB/s
    with pytest.raises(sl.MachineError, match="nodes >= 1"):
        sl.Machine.a100_cluster(0)


def test_bus_bandwidth_rises_with_message_size_toward_the_plateau():
    nv = sl.Machine.a100_node().levels[-1]
    rounds = 14  # ring all-reduce on 8 GPUs
    bws = [nv.bus_bandwidth(s, rounds) for s in (1e3, 1e6, 1e8, 1e10)]
    assert bws == sorted(bws) and bws[0] < 0.01 * nv.bandwidth and bws[-1] > 0.99 * nv.bandwidth


def test_links_follow_from_the_ranks_not_the_mesh_axis():
    m = sl.Machine.a100_cluster(4)
    assert m.group_link(range(8)) == (m.levels[-1].latency, m.levels[-1].bandwidth)  # one node: NVLink
    lat, one_per_node = m.group_link((0, 8, 16, 24))  # one GPU per node: one NIC per group
    assert lat == m.levels[0].latency and one_per_node == pytest.approx(m.levels[0].bandwidth)
    _, whole_nodes = m.group_link(range(32))  # every GPU of each node: all 8 NICs, capped by NVLink
    assert whole_nodes == pytest.approx(min(m.levels[-1].bandwidth, 8 * m.levels[0].bandwidth))
    _, two = m.group_link((0, 1, 8, 9, 16, 17, 24, 25))
    assert one_per_node < two < whole_nodes


def test_gemm_efficiency_rises_with_size_views_are_free_memory_bound_at_achievable_bandwidth():
    d = sl.Machine.a100_node().device
    effs = [d.gemm_efficiency(2 * n**3) for n in (256, 1024, 4096, 16384)]
    assert effs == sorted(effs) and effs[-1] <= d.gemm_ceiling < 1.0 and effs[0] < 0.1
    n = 4096
    t = d.kernel_seconds("aten.mm.default", 2 * n**3, 3 * n * n * 2, torch.bfloat16)
    assert 2 * n**3 / t == pytest.approx(312e12 * d.gemm_efficiency(2 * n**3))
    assert d.kernel_seconds("aten.view.default", 0, 1e9, torch.bfloat16) == 0.0
    assert kernel_class("aten.transpose.int") == "view" and kernel_class("linear_grad_weight") == "gemm"
    t = d.kernel_seconds("aten.add.Tensor", 1e8, 1.2e9, torch.bfloat16)
    assert t == pytest.approx(1.2e9 / (2.039e12 * d.mem_efficiency))
    assert d.kernel_seconds("aten.add.Tensor", 1, 4, torch.float32) == d.kernel_floor


def test_a_measured_figure_replaces_the_models():
    m = sl.Machine.h100_node()
    key = op_key("aten.mm.default", [(64, 64), (64, 64)], torch.float32, "cuda")
    modelled, measured = m.op_time(key, 2 * 64**3, 3 * 64 * 64 * 4, torch.float32)
    assert not measured and modelled > 0
    cal = m.with_measurements(origin="measured", op_times=[(key, 1.5e-3)])
    assert isinstance(cal, sl.Machine) and cal.op_time(key, 2 * 64**3, 0, torch.float32) == (1.5e-3, True)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_from_file_reads_presets_and_written_out_machines(tmp_path, suffix):
    p = tmp_path / f"m{suffix}"
    if suffix == ".json":
        p.write_text(json.dumps({"preset": "h100_cluster", "nodes": 2, "device": {"memory": 96 * 2**30}}))
    else:
        p.write_text('preset = "h100_cluster"\nnodes = 2\n[device]\nmemory = 103079215104\n')
    m = sl.Machine.from_file(p)
    assert m.devices == 16 and m.memory_bytes == 96 * 2**30 and m.levels == sl.Machine.h100_cluster(2).levels
    full = tmp_path / "full.json"
    full.write_text(json.dumps(sl.Machine.a100_cluster(2).to_dict()))
    back = sl.Machine.from_file(full)
    assert back.device == sl.Machine.a100_cluster(2).device and back.levels == sl.Machine.a100_cluster(2).levels


@pytest.mark.parametrize("data,match", [
    ({"preset": "tpu_pod"}, "unknown preset 'tpu_pod'"),
    ({"preset": "a100_cluster", "nodes": 2, "gpus": 8}, "only 'nodes'"),
    ({"name": "x", "nodes": 1}, "missing"),
    ({"preset": "a100_cluster", "device": {"hbm": 1}}, "unknown DeviceModel field"),
    ({"preset": "a100_cluster", "device": {"gemm_ceiling": 1.5}}, r"fraction of the peak"),
])
def test_bad_machine_files_say_what_is_wrong(tmp_path, data, match):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(sl.MachineError, match=match):
        sl.Machine.from_file(p)
    with pytest.raises(sl.MachineError, match="no file"):
        sl.Machine.from_file(tmp_path / "none.json")


def _mlp_step(placement: sl.Placement):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    st = sl.presets.data_parallel(placement)
    return sl.compile(m, (x,), loss_fn=torch.nn.functional.mse_loss, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=st)


def test_the_same_mesh_inside_a_node_is_faster_than_across_nodes():
    m = sl.Machine.a100_cluster(2)
    inside = sl.simulate(_mlp_step(sl.Placement(None, [0, 1, 2, 3])), m)
    across = sl.simulate(_mlp_step(sl.Placement(None, [0, 8, 1, 9])), m)

    def comm_seconds(pred) -> float:  # transfer time of rank 0's collectives (hidden behind compute or not)
        f = pred.firings
        return sum(f.end[j] - f.xfer[j] for j in range(len(f)) if f.lane[j] == COMM and f.rank[j] == 0)

    assert comm_seconds(across) > 2 * comm_seconds(inside) > 0


@pytest.mark.parametrize("machine", [sl.Machine.h100_node(), sl.Machine.a100_cluster(2), sl.Hardware.h100_ib(2)],
                         ids=["node", "a100-ib", "h100_ib"])
def test_every_mesh_choice_simulates_the_same_on_its_view_and_on_the_machine(machine):
    """The search prices a mesh on ``choice.hardware(machine)``; the user simulates on ``machine``."""
    devices = min(16, machine.devices)
    seen_ndims = set()
    for choice in mesh_choices(devices, machine):
        pl = choice.placement()
        seen_ndims.add(pl.ndim)
        step = _mlp_step(pl)
        view = choice.hardware(machine)
        assert sl.simulate(step, view).step_time == sl.simulate(step, machine).step_time, choice
    assert seen_ndims == {1, 2}


@pytest.mark.parametrize("machine,ndim", [(sl.Machine.h100_cluster(2), 2), (sl.Hardware.h100_ib(2), 1)],
                         ids=["h100-ib-2d", "h100_ib-1d"])
def test_search_prediction_is_the_users_machine_prediction(machine, ndim):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    res = sl.search(m, (x,), loss_fn=torch.nn.functional.mse_loss, target=y, optimizer=sl.SGD(lr=0.1),
                    devices=16, hardware=machine, method="cd", time_budget=20, rerank_top=1, pipelines=False,
                    max_mesh_ndim=ndim)
    assert res.predicted.source == "simulator"
    step = sl.compile(m, (x,), loss_fn=torch.nn.functional.mse_loss, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=res.strategy)
    assert sl.simulate(step, machine).step_time == pytest.approx(res.predicted.step_time, rel=1e-9)
