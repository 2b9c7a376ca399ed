"""Hardware: the few numbers a cost model needs (link bandwidth and latency per mesh axis, device speed).

Boxing plans and SBP choices are compared by estimated time, not just bytes, because the same bytes
cost 10x more over InfiniBand than over NVLink. A ring collective over ``p`` ranks is modelled as

    time = latency * (ring steps) + bytes sent by the busiest rank / bandwidth

which is the alpha-beta model NCCL's own tuner and AutoDDL use. The presets are estimates from public
spec sheets (and, for the CPU box, from typical Gloo-over-shared-memory figures), not measurements;
they are meant to rank alternatives correctly, not to predict milliseconds.

A calibrated Hardware (``LocalCluster.calibrate()``) is the same class with measured figures added:
per (collective kind, mesh axis, group size) an alpha-beta fit, per compute op instance (op, local
input shapes, dtype, device) its measured time, the runtime's overhead per actor firing, and the
cores the ranks share. Every query falls back to the spec-sheet figures (a roofline for compute)
where nothing was measured, and says which it used, so a prediction can tell measured from modelled.

A ``Machine`` (``machine.py``) is a Hardware that describes the cluster rather than a mesh: nodes of
devices, link levels and a device model with achievable efficiency; the link of a collective follows
from its ranks there, not from its mesh axis.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

from .errors import InputError

OpKey = tuple[str, tuple[tuple[int, ...], ...], str, str]  # (op, local input shapes, dtype, device type)


def op_key(op: str, in_shapes, dtype: torch.dtype | str, device_type: str) -> OpKey:
    """The key of one compute op instance in the op-time table."""
    return (op, tuple(tuple(int(d) for d in s) for s in in_shapes), str(dtype).replace("torch.", ""), device_type)


@dataclass(frozen=True)
class CommFit:
    """A measured alpha-beta fit of one collective kind on one mesh axis (None: point to point).

    time(bytes) = alpha * steps + bytes / bandwidth, with ``steps`` the kind's ring steps; ``rel_error``
    is the fit's median relative error over the measured sizes.

    ``busy_alpha`` is alpha measured while every core of the machine runs compute (CPU ranks
    outnumbering or filling the cores). A transfer then waits for the scheduler to give its threads a
    core, a wait that grows with the rounds and not with the bytes: on a 2-core box with 4 ranks it
    is milliseconds per collective against a tenth of that on idle cores. None: not measured (the
    ranks could not fill the cores), the transfer costs ``alpha`` whatever runs beside it.
    """

    kind: str
    axis: int | None
    group_size: int
    alpha: float  # seconds per ring step (or per message)
    bandwidth: float  # bytes/s
    rel_error: float = 0.0
    busy_alpha: float | None = None  # seconds per round while every core computes


def _positive(name: str, v: float) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
        raise InputError(f"Hardware.{name} must be a positive number, got {v!r}")


def _non_negative(name: str, v: float) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
        raise InputError(f"Hardware.{name} must be a number >= 0, got {v!r}")


@dataclass(frozen=True)
class Hardware:
    """Per-mesh-axis links and per-device speeds. Frozen and hashable, so plans can be cached on it."""

    name: str
    axis_bandwidth: tuple[float, ...]  # bytes/s per direction per rank, one entry per mesh axis
    axis_latency: tuple[float, ...]  # seconds per ring step, one entry per mesh axis
    p2p_bandwidth: float  # bytes/s of a point-to-point move between placements (pipeline stages)
    p2p_latency: float  # seconds per point-to-point message
    flops: float  # FLOP/s per device, fp32 dense
    mem_bandwidth: float  # bytes/s of device memory (local copies, zero fills)
    flops_bf16: float | None = None  # FLOP/s per device, bf16/fp16 dense; None: same as fp32
    cores: int | None = None  # cores all ranks of one machine share (CPU ranks); None: a device per rank
    firing_overhead: float = 0.0  # seconds the runtime spends per actor firing, besides the kernel
    op_times: tuple[tuple[OpKey, float], ...] = field(default=(), repr=False)  # measured s per op instance
    comm_fits: tuple[CommFit, ...] = field(default=(), repr=False)  # measured collectives
    origin: str = "spec sheet"  # where the figures come from ("spec sheet", "measured on ...")

    def __post_init__(self) -> None:
        object.__setattr__(self, "axis_bandwidth", tuple(self.axis_bandwidth))
        object.__setattr__(self, "axis_latency", tuple(self.axis_latency))
        if not self.axis_bandwidth:
            raise InputError("Hardware.axis_bandwidth needs at least one entry (mesh axis 0)")
        if len(self.axis_bandwidth) != len(self.axis_latency):
            raise InputError(
                f"Hardware {self.name!r}: axis_bandwidth has {len(self.axis_bandwidth)} entries but "
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
        if self.cores is not None and (not isinstance(self.cores, int) or self.cores < 1):
            raise InputError(f"Hardware.cores must be an int >= 1 or None, got {self.cores!r}")
        _non_negative("firing_overhead", self.firing_overhead)
        object.__setattr__(self, "op_times", tuple(self.op_times))
        object.__setattr__(self, "comm_fits", tuple(self.comm_fits))

    # --- queries ----------------------------------------------------------------------------
    def link(self, axis: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) of mesh ``axis``; a hardware with fewer axes repeats its last."""
        if axis < 0:
            raise InputError(f"mesh axis must be >= 0, got {axis}")
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

    # --- measured figures, with the spec sheet as fallback ------------------------------------------
    @property
    def measured(self) -> bool:
        """True when any figure was measured (a calibration), not only taken from a spec sheet."""
        return bool(self.op_times or self.comm_fits)

    @cached_property
    def _op_table(self) -> dict[OpKey, float]:
        return dict(self.op_times)

    @cached_property
    def _fit_table(self) -> dict[tuple, CommFit]:
        out: dict[tuple, CommFit] = {}
        for f in self.comm_fits:
            out[(f.kind, f.axis, f.group_size)] = f
            out.setdefault((f.kind, f.axis, None), f)
        return out

    def comm_fit(self, kind: str, axis: int | None, group_size: int | None = None) -> CommFit | None:
        """The measured fit for ``kind`` on ``axis`` (exact group size first, then any), or None."""
        t = self._fit_table
        return t.get((kind, axis, group_size)) or t.get((kind, axis, None))

    def alpha_beta(self, kind: str, axis: int | None, group_size: int | None = None,
                   busy: bool = False) -> tuple[float, float]:
        """(seconds per ring step or message, bytes/s) of a step of ``kind`` on mesh ``axis``.

        ``axis`` None is a point-to-point move between placements. A calibrated fit wins; otherwise
        the link's spec-sheet figures. ``busy``: while every core computes (the fit's ``busy_alpha``
        where it was measured).
        """
        fit = self.comm_fit(kind, axis, group_size)
        if fit is not None:
            if busy and fit.busy_alpha is not None:
                return fit.busy_alpha, fit.bandwidth
            return fit.alpha, fit.bandwidth
        if axis is None:
            return self.p2p_latency, self.p2p_bandwidth
        bw, lat = self.link(axis)
        return lat, bw

    def op_time(self, key: OpKey, flops: float, nbytes: float, dtype: torch.dtype) -> tuple[float, bool]:
        """(seconds, measured?) of one compute op instance: the table, else a roofline on the peaks."""
        t = self._op_table.get(key)
        if t is not None:
            return t, True
        return max(flops / self.flops_for(dtype), nbytes / self.mem_bandwidth), False

    def with_measurements(self, *, name: str | None = None, origin: str, op_times=(), comm_fits=(),
                          firing_overhead: float | None = None, cores: int | None = None,
                          **figures: float) -> Hardware:
        """A copy with measured figures added (later ones win); ``figures`` replaces peaks/links."""
        ops = dict(self.op_times)
        ops.update(dict(op_times))
        fits = {(f.kind, f.axis, f.group_size): f for f in (*self.comm_fits, *comm_fits)}
        return replace(self, name=name or self.name, origin=origin, op_times=tuple(sorted(ops.items())),
                       comm_fits=tuple(fits.values()),
                       firing_overhead=self.firing_overhead if firing_overhead is None else firing_overhead,
                       cores=self.cores if cores is None else cores, **figures)

    # --- presets ----------------------------------------------------------------------------
    @classmethod
    def cpu_box(cls) -> Hardware:
        """This 2-core CPU machine, ranks as processes talking Gloo over loopback / shared memory.

        Estimates: Gloo's TCP transport on localhost moves a few GB/s with ~30 us per message; two
        AVX2 cores sustain ~50 GFLOP/s fp32 in a matmul; memory ~10 GB/s for a single stream.
        """
        return cls(name="cpu_box", axis_bandwidth=(3e9,), axis_latency=(30e-6,), p2p_bandwidth=3e9,
                   p2p_latency=30e-6, flops=50e9, mem_bandwidth=10e9, cores=os.cpu_count() or 1)

    @classmethod
    def h100_node(cls) -> Hardware:
        """One node of 8 H100 SXM on NVLink 4 / NVSwitch (spec-sheet estimates).

        ~450 GB/s per direction per GPU, a few us per ring step; ~990 TFLOP/s bf16 dense, ~60 TFLOP/s
        fp32 (non-tensor-core), 3.35 TB/s HBM3.
        """
        return cls(name="h100_node", axis_bandwidth=(450e9,), axis_latency=(3e-6,), p2p_bandwidth=450e9,
                   p2p_latency=3e-6, flops=60e12, mem_bandwidth=3.35e12, flops_bf16=990e12)

    @classmethod
    def a100_node(cls) -> Hardware:
        """One node of 8 A100 SXM 80GB on NVLink 3 / NVSwitch (spec-sheet estimates).

        ~300 GB/s per direction per GPU, ~19.5 TFLOP/s fp32, ~312 TFLOP/s bf16 dense, 2.0 TB/s HBM2e.
        """
        return cls(name="a100_node", axis_bandwidth=(300e9,), axis_latency=(4e-6,), p2p_bandwidth=300e9,
                   p2p_latency=4e-6, flops=19.5e12, mem_bandwidth=2.0e12, flops_bf16=312e12)

    @classmethod
    def h100_ib(cls, nodes: int = 2) -> Hardware:
        """``nodes`` H100 nodes: mesh axis 0 crosses nodes on 400 Gb/s InfiniBand (one NIC per GPU),
        axis 1 stays inside a node on NVLink. Use it with a ``(nodes, 8)`` mesh.

        InfiniBand NDR: 400 Gb/s = 50 GB/s per direction per GPU, ~5 us per step including the switch;
        stage-to-stage moves are assumed to cross nodes. It is a ``Machine`` of spec-sheet figures: a
        collective's link follows from its ranks (8 per node), whichever mesh axis it runs on, so any
        mesh laid out on these nodes is priced on the same machine (``sl.Machine.h100_cluster`` adds
        achievable efficiencies).
        """
        from .machine import LinkLevel, Machine

        if not isinstance(nodes, int) or nodes < 1:
            raise InputError(f"Hardware.h100_ib needs nodes >= 1, got {nodes!r}")
        return Machine(name=f"h100_ib_{nodes}nodes", axis_bandwidth=(50e9, 450e9), axis_latency=(5e-6, 3e-6),
                       p2p_bandwidth=50e9, p2p_latency=5e-6, flops=60e12, mem_bandwidth=3.35e12,
                       flops_bf16=990e12, nodes=nodes, devices_per_node=8,
                       levels=(LinkLevel("InfiniBand NDR 400 Gb/s", 50e9, 5e-6, nics=8),
                               LinkLevel("NVLink 4 / NVSwitch", 450e9, 3e-6)))

    def __repr__(self) -> str:
        bws = ", ".join(f"{b / 1e9:g} GB/s" for b in self.axis_bandwidth)
        lats = ", ".join(f"{x * 1e6:g} us" for x in self.axis_latency)
        how = f", {len(self.op_times)} ops and {len(self.comm_fits)} collectives measured" if self.measured else ""
        return f"Hardware({self.name!r}, axes=[{bws}], latency=[{lats}], {self.origin}{how})"
