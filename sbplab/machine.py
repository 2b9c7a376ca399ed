"""Machine: the physical cluster (nodes x devices, link levels, device model), apart from any mesh.

A ``Hardware`` prices mesh axis ``a`` with its ``a``-th link: it describes a mesh, not a machine, so a
strategy whose mesh axes are laid out differently (a search reordering them) needed a different
Hardware. A ``Machine`` describes the machine (Alpa's physical mesh): ``nodes`` nodes of
``devices_per_node`` devices; link ``levels``, outermost first (InfiniBand between nodes, NVLink inside
one); a ``DeviceModel`` with peaks per dtype, memory and achievable efficiency. Which link a collective
uses follows from its ranks (rank ``r`` lives on node ``r // devices_per_node``): a group inside one node
uses the inner level, a group across nodes the outer one, at the share of the node's NICs its ranks
use. Any strategy's logical mesh is priced on the same Machine, so ``sl.simulate(res.strategy, machine)``
is what the search predicted for it.

A Machine is a Hardware (every entry point that takes one takes a Machine); its ``axis_bandwidth`` /
``axis_latency`` are the links of the mesh a full node group would use (outer, inner), what analytic
pricing of a mesh axis reads (``for_placement`` gives those of a given placement). Measured figures
(``calibrate``: op times, collective fits) replace the model's where they exist.

    m = sl.Machine.a100_cluster(4)                 # 4 DGX A100 80GB on InfiniBand HDR
    m = sl.Machine.from_file("cluster.toml")       # or JSON, see ``to_dict``
    sl.simulate(step, m)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from .hardware import Hardware, OpKey
from .machine_device import DeviceModel, MachineError


@dataclass(frozen=True)
class LinkLevel:
    """One level of the machine's network, as a collective sees it.

    bandwidth: achievable bus bandwidth per rank at large messages, bytes/s (nccl-tests' busbw plateau);
        for a level between nodes, per NIC.
    latency: seconds per ring step (alpha); with ``bandwidth`` it gives nccl-tests' curve of bus
        bandwidth rising with message size.
    nics: for a level between nodes, NICs per node (0 inside a node): a group with ``k`` of a node's
        ranks gets ``k / devices_per_node`` of them, all groups of a node communicating at once.
    """

    name: str
    bandwidth: float
    latency: float
    nics: int = 0

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise MachineError(f"LinkLevel {self.name!r}: bandwidth must be positive bytes/s, got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise MachineError(f"LinkLevel {self.name!r}: latency must be >= 0 s, got {self.latency!r}")
        if not isinstance(self.nics, int) or self.nics < 0:
            raise MachineError(f"LinkLevel {self.name!r}: nics must be an int >= 0, got {self.nics!r}")

    def bus_bandwidth(self, message_bytes: float, rounds: int) -> float:
        """nccl-tests' busbw of a collective moving ``message_bytes`` per rank in ``rounds`` ring steps."""
        t = self.latency * rounds + message_bytes / self.bandwidth
        return message_bytes / t if t > 0 else self.bandwidth


@dataclass(frozen=True)
class Machine(Hardware):
    """Nodes x devices, link levels (outermost first) and a device model; see the module doc."""

    nodes: int = 1
    devices_per_node: int = 1
    levels: tuple[LinkLevel, ...] = ()
    device: DeviceModel | None = None  # None: the Hardware roofline on its peaks

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "levels", tuple(self.levels))
        for f in ("nodes", "devices_per_node"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MachineError(f"Machine {self.name!r}: {f} must be an int >= 1, got {v!r}")
        if not self.levels:
            raise MachineError(f"Machine {self.name!r}: levels needs at least one LinkLevel (inside a node)")
        if self.nodes > 1 and len(self.levels) < 2:
            raise MachineError(f"Machine {self.name!r}: {self.nodes} nodes need two link levels (between "
                               f"nodes, then inside one), got {len(self.levels)}")

    # --- construction -------------------------------------------------------------------------------
    @classmethod
    def make(cls, name: str, nodes: int, devices_per_node: int, levels: tuple[LinkLevel, ...] | list,
             device: DeviceModel, *, origin: str = "machine model", **hardware: Any) -> Machine:
        """A Machine whose Hardware figures (per-axis links, peaks) are derived from its parts."""
        levels = tuple(levels)
        for f, v in (("nodes", nodes), ("devices_per_node", devices_per_node)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MachineError(f"Machine {name!r}: {f} must be an int >= 1, got {v!r}")
        if not isinstance(device, DeviceModel):
            raise MachineError(f"Machine {name!r}: device must be a DeviceModel, got {type(device).__name__}")
        if not levels:
            raise MachineError(f"Machine {name!r}: levels needs at least one LinkLevel (inside a node)")
        inner = levels[-1]
        outer = levels[0] if nodes > 1 else inner
        full = _group_bandwidth(outer, inner, devices_per_node, devices_per_node) if nodes > 1 else inner.bandwidth
        bws = (full, inner.bandwidth) if nodes > 1 else (inner.bandwidth,)
        lats = (outer.latency, inner.latency) if nodes > 1 else (inner.latency,)
        peaks = dict(device.peaks)
        fields = dict(axis_bandwidth=bws, axis_latency=lats, p2p_bandwidth=outer.bandwidth,
                      p2p_latency=outer.latency, flops=peaks["fp32"], mem_bandwidth=device.mem_bandwidth,
                      flops_bf16=peaks.get("bf16"), origin=origin)
        fields.update(hardware)
        return cls(name=name, nodes=nodes, devices_per_node=devices_per_node, levels=levels, device=device,
                   **fields)

    @classmethod
    def a100_node(cls) -> Machine:
        """One DGX A100 80GB: 8 GPUs on NVLink 3 / NVSwitch (figures and sources: ``machine_presets.py``)."""
        from .machine_presets import a100_cluster

        return a100_cluster(1)

    @classmethod
    def a100_cluster(cls, nodes: int) -> Machine:
        """``nodes`` DGX A100 80GB on InfiniBand HDR, one 200 Gb/s NIC per GPU."""
        from .machine_presets import a100_cluster

        return a100_cluster(nodes)

    @classmethod
    def h100_node(cls) -> Machine:
        """One DGX H100: 8 H100 SXM on NVLink 4 / NVSwitch."""
        from .machine_presets import h100_cluster

        return h100_cluster(1)

    @classmethod
    def h100_cluster(cls, nodes: int) -> Machine:
        """``nodes`` DGX H100 on InfiniBand NDR, one 400 Gb/s NIC per GPU."""
        from .machine_presets import h100_cluster

        return h100_cluster(nodes)

    @classmethod
    def from_file(cls, path: str | Path) -> Machine:
        """A Machine from a JSON or TOML file: ``{"preset": "a100_cluster", "nodes": 4}``, optionally with
        ``"device"`` overrides, or every part written out as ``to_dict`` writes it."""
        from .machine_presets import machine_from_dict

        p = Path(path)
        if not p.is_file():
            raise MachineError(f"Machine.from_file: no file at {str(p)!r}")
        text = p.read_text()
        try:
            if p.suffix.lower() == ".toml":
                import tomllib

                data = tomllib.loads(text)
            else:
                data = json.loads(text)
        except ValueError as e:
            raise MachineError(f"Machine.from_file: {str(p)!r} is not valid {p.suffix.lstrip('.') or 'JSON'}: "
                               f"{e}") from None
        return machine_from_dict(data, where=str(p))

    def to_dict(self) -> dict[str, Any]:
        """Every part as plain numbers (``from_file`` reads it back); measured figures are not included."""
        return {"name": self.name, "nodes": self.nodes, "devices_per_node": self.devices_per_node,
                "levels": [asdict(lv) for lv in self.levels],
                "device": None if self.device is None else {**asdict(self.device), "peaks": dict(self.device.peaks)}}

    # --- the physical mesh ---------------------------------------------------------------------------
    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def memory_bytes(self) -> int | None:
        """Bytes of memory of one device (None: the device model does not say)."""
        return None if self.device is None else self.device.memory

    def node_of(self, rank: int) -> int:
        """The node rank ``rank`` lives on (ranks fill nodes in order, as torchrun numbers them)."""
        return rank // self.devices_per_node

    @cached_property
    def _group_links(self) -> dict[tuple[int, ...], tuple[float, float]]:
        return {}  # group -> group_link: a simulation asks for the same few groups on every rank

    def group_link(self, ranks: tuple[int, ...] | list[int]) -> tuple[float, float]:
        """(latency s per ring step, bus bandwidth bytes/s per rank) of a collective over ``ranks``."""
        key = tuple(ranks)
        hit = self._group_links.get(key)
        if hit is None:
            hit = self._group_links[key] = self._group_link(key)
        return hit

    def _group_link(self, ranks: tuple[int, ...]) -> tuple[float, float]:
        inner = self.levels[-1]
        per_node: dict[int, int] = {}
        for r in ranks:
            n = self.node_of(r)
            per_node[n] = per_node.get(n, 0) + 1
        if len(per_node) <= 1 or len(self.levels) < 2:
            return inner.latency, inner.bandwidth
        k = min(per_node.values())
        return self.levels[0].latency, _group_bandwidth(self.levels[0], inner, k, self.devices_per_node)

    def collective_alpha_beta(self, kind: str, axis: int | None, ranks: tuple[int, ...],
                              busy: bool = False) -> tuple[float, float]:
        """(alpha, bytes/s) of ``kind`` over ``ranks``: a calibrated fit for this kind, mesh axis and group
        size where one was measured, else the level the ranks span. A point-to-point move (two ranks,
        ``axis`` None) uses one NIC when it leaves the node."""
        fit = self.comm_fit(kind, axis, len(ranks))
        if fit is not None:
            return (fit.busy_alpha if busy and fit.busy_alpha is not None else fit.alpha), fit.bandwidth
        if axis is None and len({self.node_of(r) for r in ranks}) > 1:
            outer = self.levels[0]
            return outer.latency, outer.bandwidth
        return self.group_link(ranks)

    def for_placement(self, placement: Any) -> Machine:
        """This machine with ``axis_bandwidth`` / ``axis_latency`` those of ``placement``'s mesh axes (what
        analytic per-axis pricing reads); simulation prices by ranks either way."""
        bws, lats = [], []
        for a in range(placement.ndim):
            lat, bw = self.group_link(tuple(placement.groups(a)[0]))
            bws.append(bw)
            lats.append(lat)
        if tuple(bws) == self.axis_bandwidth and tuple(lats) == self.axis_latency:
            return self
        return replace(self, axis_bandwidth=tuple(bws), axis_latency=tuple(lats))

    # --- compute -------------------------------------------------------------------------------------
    def flops_for(self, dtype: torch.dtype) -> float:
        if self.device is None:
            return super().flops_for(dtype)
        return self.device.peak(dtype)

    def op_time(self, key: OpKey, flops: float, nbytes: float, dtype: torch.dtype) -> tuple[float, bool]:
        """(seconds, measured?): the measured table first, else the device model's achievable efficiency."""
        t = self._op_table.get(key)
        if t is not None:
            return t, True
        if self.device is None:
            return super().op_time(key, flops, nbytes, dtype)
        return self.device.kernel_seconds(key[0], flops, nbytes, dtype), False

    def __repr__(self) -> str:
        dev = self.device.name if self.device is not None else "spec-sheet peaks"
        lv = ", ".join(f"{x.name} {x.bandwidth / 1e9:g} GB/s" for x in self.levels)
        return f"Machine({self.name!r}: {self.nodes} x {self.devices_per_node} {dev}; {lv}; {self.origin})"


def _group_bandwidth(outer: LinkLevel, inner: LinkLevel, k: int, devices_per_node: int) -> float:
    """Bus bandwidth per rank of a ring across nodes with ``k`` ranks on each node: a ring's traffic leaves
    each node once per channel, so the node's share of NICs for this group bounds it, all groups of the
    node (``devices_per_node / k`` of them) communicating at once; never above the inner link."""
    nics = outer.nics or devices_per_node
    return min(inner.bandwidth, outer.bandwidth * nics * k / devices_per_node)
