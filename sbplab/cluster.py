"""Cluster: the few numbers a cost model needs (link bandwidth and latency per mesh axis, device speed).

Boxing plans and SBP choices are compared by estimated time, not just bytes, because the same bytes
cost 10x more over InfiniBand than over NVLink. A ring collective over ``p`` ranks is modelled as

    time = latency * (ring steps) + bytes sent by the busiest rank / bandwidth

which is the alpha-beta model NCCL's own tuner and AutoDDL use. The presets are estimates from public
spec sheets (and, for the CPU box, from typical Gloo-over-shared-memory figures), not measurements;
they are meant to rank alternatives correctly, not to predict milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _positive(name: str, v: float) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
        raise ValueError(f"Cluster.{name} must be a positive number, got {v!r}")


def _non_negative(name: str, v: float) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
        raise ValueError(f"Cluster.{name} must be a number >= 0, got {v!r}")


@dataclass(frozen=True)
class Cluster:
    """Per-mesh-axis links and per-device speeds. Frozen and hashable, so plans can be cached on it."""

    name: str
    axis_bandwidth: tuple[float, ...]  # bytes/s per direction per rank, one entry per mesh axis
    axis_latency: tuple[float, ...]  # seconds per ring step, one entry per mesh axis
    p2p_bandwidth: float  # bytes/s of a point-to-point move between placements (pipeline stages)
    p2p_latency: float  # seconds per point-to-point message
    flops: float  # FLOP/s per device, fp32 dense
    mem_bandwidth: float  # bytes/s of device memory (local copies, zero fills)
    flops_bf16: float | None = None  # FLOP/s per device, bf16/fp16 dense; None: same as fp32

    def __post_init__(self) -> None:
        object.__setattr__(self, "axis_bandwidth", tuple(self.axis_bandwidth))
        object.__setattr__(self, "axis_latency", tuple(self.axis_latency))
        if not self.axis_bandwidth:
            raise ValueError("Cluster.axis_bandwidth needs at least one entry (mesh axis 0)")
        if len(self.axis_bandwidth) != len(self.axis_latency):
            raise ValueError(
                f"Cluster {self.name!r}: axis_bandwidth has {len(self.axis_bandwidth)} entries but "
                f"axis_latency has {len(self.axis_latency)}; give one of each per mesh axis"
            )
        for i, (bw, lat) in enumerate(zip(self.axis_bandwidth, self.axis_latency)):
            _positive(f"axis_bandwidth[{i}]", bw)
            _non_negative(f"axis_latency[{i}]", lat)
        _positive("p2p_bandwidth", self.p2p_bandwidth)
        _non_negative("p2p_latency", self.p2p_latency)
        _positive("flops", self.flops)
        _positive("mem_bandwidth", self.mem_bandwidth)
        if self.flops_bf16 is not None:
            _positive("flops_bf16", self.flops_bf16)

    # --- queries ----------------------------------------------------------------------------
    def link(self, axis: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) of mesh ``axis``; a cluster with fewer axes repeats its last."""
        if axis < 0:
            raise ValueError(f"mesh axis must be >= 0, got {axis}")
        i = min(axis, len(self.axis_bandwidth) - 1)
        return self.axis_bandwidth[i], self.axis_latency[i]

    def ring_time(self, axis: int, steps: int, bytes_per_rank: float) -> float:
        """Alpha-beta time of a ring collective on mesh ``axis``."""
        bw, lat = self.link(axis)
        return lat * steps + bytes_per_rank / bw

    def p2p_time(self, messages: int, bytes_per_rank: float) -> float:
        return self.p2p_latency * messages + bytes_per_rank / self.p2p_bandwidth

    def copy_time(self, nbytes: float) -> float:
        """A local write of ``nbytes`` (zero fill, copy) at memory bandwidth."""
        return nbytes / self.mem_bandwidth

    def flops_for(self, dtype: torch.dtype) -> float:
        if dtype in (torch.bfloat16, torch.float16) and self.flops_bf16 is not None:
            return self.flops_bf16
        return self.flops

    # --- presets ----------------------------------------------------------------------------
    @classmethod
    def cpu_box(cls) -> Cluster:
        """This 2-core CPU machine, ranks as processes talking Gloo over loopback / shared memory.

        Estimates: Gloo's TCP transport on localhost moves a few GB/s with ~30 us per message; two
        AVX2 cores sustain ~50 GFLOP/s fp32 in a matmul; memory ~10 GB/s for a single stream.
        """
        return cls(name="cpu_box", axis_bandwidth=(3e9,), axis_latency=(30e-6,), p2p_bandwidth=3e9,
                   p2p_latency=30e-6, flops=50e9, mem_bandwidth=10e9)

    @classmethod
    def h100_node(cls) -> Cluster:
        """One node of 8 H100 SXM on NVLink 4 / NVSwitch (spec-sheet estimates).

        ~450 GB/s per direction per GPU, a few us per ring step; ~990 TFLOP/s bf16 dense, ~60 TFLOP/s
        fp32 (non-tensor-core), 3.35 TB/s HBM3.
        """
        return cls(name="h100_node", axis_bandwidth=(450e9,), axis_latency=(3e-6,), p2p_bandwidth=450e9,
                   p2p_latency=3e-6, flops=60e12, mem_bandwidth=3.35e12, flops_bf16=990e12)

    @classmethod
    def h100_ib(cls, nodes: int = 2) -> Cluster:
        """``nodes`` H100 nodes: mesh axis 0 crosses nodes on 400 Gb/s InfiniBand (one NIC per GPU),
        axis 1 stays inside a node on NVLink. Use it with a ``(nodes, 8)`` mesh.

        InfiniBand NDR: 400 Gb/s = 50 GB/s per direction per GPU, ~5 us per step including the switch;
        stage-to-stage moves are assumed to cross nodes.
        """
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"Cluster.h100_ib needs nodes >= 1, got {nodes!r}")
        return cls(name=f"h100_ib_{nodes}nodes", axis_bandwidth=(50e9, 450e9), axis_latency=(5e-6, 3e-6),
                   p2p_bandwidth=50e9, p2p_latency=5e-6, flops=60e12, mem_bandwidth=3.35e12,
                   flops_bf16=990e12)

    def __repr__(self) -> str:
        bws = ", ".join(f"{b / 1e9:g} GB/s" for b in self.axis_bandwidth)
        lats = ", ".join(f"{x * 1e6:g} us" for x in self.axis_latency)
        return f"Cluster({self.name!r}, axes=[{bws}], latency=[{lats}])"
