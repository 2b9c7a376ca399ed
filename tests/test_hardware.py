"""Hardware: presets, per-axis links, the alpha-beta formula and validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import sbplab as sl


def test_presets_are_ordered_like_the_hardware():
    cpu, node, ib = sl.Hardware.cpu_box(), sl.Hardware.h100_node(), sl.Hardware.h100_ib(4)
    assert node.link(0)[0] == pytest.approx(450e9)
    assert node.link(0)[1] < 10e-6
    assert node.mem_bandwidth == pytest.approx(3.35e12)
    assert node.flops_for(torch.bfloat16) == pytest.approx(990e12)
    assert node.flops_for(torch.float32) < node.flops_for(torch.bfloat16)
    assert cpu.flops_for(torch.bfloat16) == cpu.flops  # no separate bf16 figure: fp32 rate
    ib_bw, ib_lat = ib.link(0)
    nv_bw, nv_lat = ib.link(1)
    assert ib_bw == pytest.approx(400e9 / 8)  # 400 Gb/s per GPU
    assert ib_bw < nv_bw and ib_lat >= nv_lat
    assert cpu.link(0)[0] < node.link(0)[0]
    assert "4" in ib.name


def test_fewer_axes_than_the_mesh_repeat_the_last():
    ib = sl.Hardware.h100_ib(2)
    assert ib.link(2) == ib.link(1) == ib.link(7)
    node = sl.Hardware.h100_node()
    assert node.link(3) == node.link(0)
    with pytest.raises(ValueError, match="mesh axis"):
        node.link(-1)


def test_ring_time_is_alpha_beta():
    cl = sl.Hardware("t", axis_bandwidth=(1e9, 4e9), axis_latency=(1e-5, 2e-6), p2p_bandwidth=2e9,
                    p2p_latency=1e-5, flops=1e12, mem_bandwidth=1e11)
    assert cl.ring_time(1, 3, 8e6) == pytest.approx(3 * 2e-6 + 8e6 / 4e9)
    assert cl.ring_time(0, 1, 0) == pytest.approx(1e-5)
    assert cl.p2p_time(2, 2e9) == pytest.approx(2e-5 + 1.0)
    assert cl.copy_time(1e11) == pytest.approx(1.0)


def test_frozen_and_hashable():
    a, b = sl.Hardware.h100_node(), sl.Hardware.h100_node()
    assert a == b and hash(a) == hash(b) and len({a, b, sl.Hardware.cpu_box()}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.flops = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("kwargs,match", [
    (dict(axis_bandwidth=(1e9, 1e9), axis_latency=(1e-6,)), "one of each per mesh axis"),
    (dict(axis_bandwidth=(), axis_latency=()), "at least one entry"),
    (dict(axis_bandwidth=(-1.0,), axis_latency=(1e-6,)), r"axis_bandwidth\[0\] must be a positive"),
    (dict(axis_bandwidth=(1e9,), axis_latency=(-1e-6,)), r"axis_latency\[0\] must be a number >= 0"),
    (dict(axis_bandwidth=(1e9,), axis_latency=(1e-6,), flops=0), "flops must be a positive"),
])
def test_validation_states_the_invariant(kwargs, match):
    base = dict(name="bad", axis_bandwidth=(1e9,), axis_latency=(1e-6,), p2p_bandwidth=1e9, p2p_latency=0.0,
                flops=1e12, mem_bandwidth=1e10)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sl.Hardware(**base)
    with pytest.raises(ValueError, match="nodes >= 1"):
        sl.Hardware.h100_ib(0)


def test_hardware_is_the_only_name_and_compile_takes_hardware():
    """``sl.Cluster`` was renamed: it is gone, not kept as a second name, and ``compile`` says ``hardware=``."""
    import inspect

    assert not hasattr(sl, "Cluster") and hasattr(sl, "Hardware")
    params = inspect.signature(sl.compile).parameters
    assert "hardware" in params and "cluster" not in params
