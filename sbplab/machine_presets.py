"""Machine presets (DGX A100 80GB, DGX H100 and InfiniBand clusters of them), each figure with its source,
and machines read from a dict (``Machine.from_file``).

Peaks and capacities are datasheet figures. Efficiencies and bus bandwidths are what published
measurements reach, not the datasheet's peaks: a preset should predict what a well-tuned framework gets
(``benchmarks/bench_published.py`` checks that against the Megatron-LM paper), and a calibration on a
real cluster replaces any of them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from .machine import LinkLevel, Machine, MachineError
from .machine_device import DeviceModel

GiB = 2**30

# NVIDIA A100 80GB SXM datasheet (dense, no sparsity): FP32 19.5 TFLOP/s, TF32 156, BF16/FP16 312 (tensor
# cores); HBM2e 2,039 GB/s; 80 GB (nvidia-smi: 81920 MiB).
A100_80GB = DeviceModel(
    name="A100 80GB SXM",
    peaks={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    mem_bandwidth=2.039e12,
    memory=80 * GiB,
    # NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background": large fp16/bf16 GEMMs on
    # A100 sustain ~250-270 TFLOP/s (0.80-0.87 of 312); a 1024^3 GEMM (2.1 GFLOP) about two thirds of that.
    gemm_ceiling=0.85,
    gemm_half_flops=1.0e9,
    # FlashAttention-2 (Dao, 2023): 50-73% of the A100's peak, forward and backward together.
    attention_ceiling=0.6,
    # BabelStream / STREAM triad on A100 80GB: ~1.7-1.8 TB/s of 2.04.
    mem_efficiency=0.85,
    kernel_floor=3e-6,  # the shortest kernels' duration in Nsight traces (launch and tail)
)

# NVIDIA H100 SXM5 datasheet (dense): FP32 67 TFLOP/s, TF32 494.7, BF16/FP16 989.4; HBM3 3.35 TB/s; 80 GB.
H100_SXM = DeviceModel(
    name="H100 SXM",
    peaks={"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    mem_bandwidth=3.35e12,
    memory=80 * GiB,
    # cuBLAS bf16 GEMMs of 8192^3 on H100 SXM sustain ~700-750 TFLOP/s (0.71-0.76 of the peak, power-bound);
    # the larger device needs larger GEMMs to fill.
    gemm_ceiling=0.75,
    gemm_half_flops=3.0e9,
    # FlashAttention-3 (Shah et al., 2024): up to 740 TFLOP/s bf16 forward (75%), backward lower; FA2 ~35%.
    attention_ceiling=0.55,
    # BabelStream on H100 SXM: ~3.0 TB/s of 3.35.
    mem_efficiency=0.9,
    kernel_floor=2.5e-6,
)

# NVLink 3 / NVSwitch (DGX A100): 300 GB/s per direction per GPU; nccl-tests all_reduce_perf on 8 GPUs reaches
# a busbw of ~230 GB/s at 1 GiB messages; small messages ~15 us for 8 GPUs (14 ring steps): ~1 us a step.
NVLINK3 = LinkLevel("NVLink 3 / NVSwitch", bandwidth=230e9, latency=1.0e-6)
# NVLink 4 / NVSwitch (DGX H100): 450 GB/s per direction per GPU; nccl-tests all_reduce busbw ~360 GB/s
# without NVLink SHARP.
NVLINK4 = LinkLevel("NVLink 4 / NVSwitch", bandwidth=360e9, latency=1.0e-6)
# InfiniBand HDR (DGX A100: 8 ConnectX-6 at 200 Gb/s = 25 GB/s, one per GPU): ib_write_bw ~24 GB/s, nccl-tests
# all_reduce across DGX A100 nodes ~185-190 GB/s busbw (8 rails at ~23.5 GB/s); ~5 us a step across the switch.
IB_HDR = LinkLevel("InfiniBand HDR 200 Gb/s", bandwidth=23.5e9, latency=5e-6, nics=8)
# InfiniBand NDR (DGX H100: 8 ConnectX-7 at 400 Gb/s = 50 GB/s, one per GPU): ~46 GB/s achievable per NIC.
IB_NDR = LinkLevel("InfiniBand NDR 400 Gb/s", bandwidth=46e9, latency=5e-6, nics=8)


def _nodes(nodes: object, what: str) -> int:
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise MachineError(f"Machine.{what} needs nodes >= 1 (an int), got {nodes!r}")
    return nodes


def a100_cluster(nodes: int) -> Machine:
    nodes = _nodes(nodes, "a100_cluster")
    name = "a100_node" if nodes == 1 else f"a100_cluster_{nodes}nodes"
    levels = (NVLINK3,) if nodes == 1 else (IB_HDR, NVLINK3)
    return Machine.make(name, nodes, 8, levels, A100_80GB, origin="machine model (datasheets, nccl-tests)")


def h100_cluster(nodes: int) -> Machine:
    nodes = _nodes(nodes, "h100_cluster")
    name = "h100_node" if nodes == 1 else f"h100_cluster_{nodes}nodes"
    levels = (NVLINK4,) if nodes == 1 else (IB_NDR, NVLINK4)
    return Machine.make(name, nodes, 8, levels, H100_SXM, origin="machine model (datasheets, nccl-tests)")


PRESETS = {"a100_cluster": a100_cluster, "h100_cluster": h100_cluster,
           "a100_node": lambda nodes=1: a100_cluster(nodes), "h100_node": lambda nodes=1: h100_cluster(nodes)}


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise MachineError(f"{where}: expected a table of {cls.__name__} fields, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise MachineError(f"{where}: unknown {cls.__name__} field(s) {unknown}; valid: {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as e:
        raise MachineError(f"{where}: {e}") from None


def machine_from_dict(data: Any, where: str = "machine") -> Machine:
    """``{"preset": name, "nodes": n, "device": {...overrides}}`` or every part written out (``to_dict``)."""
    if not isinstance(data, dict):
        raise MachineError(f"{where}: a machine is a table (JSON object / TOML table), got {type(data).__name__}")
    if "preset" in data:
        extra = sorted(set(data) - {"preset", "nodes", "device", "name"})
        if extra:
            raise MachineError(f"{where}: with 'preset', only 'nodes', 'name' and 'device' (overrides) are read; "
                               f"got {extra}")
        make = PRESETS.get(data["preset"])
        if make is None:
            raise MachineError(f"{where}: unknown preset {data['preset']!r}; valid: {sorted(PRESETS)}")
        m = make(data.get("nodes", 1))
        over = data.get("device") or {}
        if over:
            dev = {**{f.name: getattr(m.device, f.name) for f in fields(DeviceModel)}, **over}
            m = Machine.make(data.get("name", m.name), m.nodes, m.devices_per_node, m.levels,
                             _build(DeviceModel, dev, f"{where}: device"), origin=f"machine file {where}")
        elif "name" in data:
            m = Machine.make(data["name"], m.nodes, m.devices_per_node, m.levels, m.device,
                             origin=f"machine file {where}")
        return m
    need = {"name", "nodes", "devices_per_node", "levels", "device"}
    missing = sorted(need - set(data))
    if missing:
        raise MachineError(f"{where}: missing {missing}; a machine file gives either 'preset' (one of "
                           f"{sorted(PRESETS)}) or all of {sorted(need)}")
    levels = data["levels"]
    if not isinstance(levels, list) or not levels:
        raise MachineError(f"{where}: levels must be a non-empty list of link levels, outermost first")
    lv = tuple(_build(LinkLevel, x, f"{where}: levels[{i}]") for i, x in enumerate(levels))
    dev = _build(DeviceModel, data["device"], f"{where}: device")
    return Machine.make(data["name"], data["nodes"], data["devices_per_node"], lv, dev,
                        origin=f"machine file {where}")
