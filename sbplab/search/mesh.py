"""Which meshes a search may use: every factorisation of the device count into a 1-D or 2-D mesh,
and, on a machine with several kinds of link, which mesh axis rides which link.

On a ``Machine`` (nodes of devices, link levels) the link of a collective follows from its ranks. A mesh
choice lays its ranks out so that the axis on the fast (inner) link holds consecutive ranks, the
ranks of one node, and its view of the machine (``hardware``) is the same Machine with the per-axis
figures of that layout, which the analytic pricing reads; ``sl.simulate`` prices by ranks, so the
search's prediction is the one the user's Machine gives for the strategy it returns. A 1-D mesh
wider than a node crosses the slow link.

A plain ``Hardware`` prices mesh axis ``a`` with its ``axis_bandwidth[a]`` whatever the ranks: a mesh
choice then uses link ``a`` for axis ``a`` (the hardware is not reordered), so again the prediction is
the one the user's Hardware gives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..hardware import Hardware
from ..machine import Machine
from ..placement import Placement
from .search_errors import SearchError


@dataclass(frozen=True)
class MeshChoice:
    """One mesh for a search: its shape, which hardware link each axis uses, and its rank layout."""

    shape: tuple[int, ...]  # mesh shape, e.g. (8,) or (2, 4)
    links: tuple[int, ...]  # per mesh axis, the index of the Hardware link it uses (0 = outermost)
    first_rank: int = 0  # pipelines place stage s at ranks s*size .. (s+1)*size-1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def placement(self, device_type: str | None = None) -> Placement:
        """Ranks laid out so the axis on the innermost link holds consecutive ranks (one node); device-free
        unless ``device_type`` binds it (a searched strategy compiles for any device)."""
        order = sorted(range(len(self.shape)), key=lambda a: self.links[a])  # outer link first
        ranks = np.arange(self.first_rank, self.first_rank + self.size).reshape([self.shape[a] for a in order])
        ranks = np.transpose(ranks, np.argsort(order))
        names = tuple(f"m{a}" for a in range(len(self.shape))) if len(self.shape) > 1 else None
        return Placement(device_type, ranks.tolist(), names)

    def hardware(self, hw: Hardware) -> Hardware:
        """``hw`` as this mesh's axes see it: a Machine with the per-axis figures of this layout's ranks
        (priced by ranks in simulation either way); a plain Hardware's links permuted to ``links``
        (unchanged for the choices ``mesh_choices`` makes for it, axis ``a`` on link ``a``)."""
        if isinstance(hw, Machine):
            return hw.for_placement(self.placement())
        bws = tuple(hw.link(k)[0] for k in self.links)
        lats = tuple(hw.link(k)[1] for k in self.links)
        if bws == hw.axis_bandwidth and lats == hw.axis_latency:
            return hw
        return replace(hw, axis_bandwidth=bws, axis_latency=lats)

    def describe(self, hw: Hardware | None = None) -> str:
        shape = "x".join(map(str, self.shape))
        if hw is None or len(hw.axis_bandwidth) == 1:
            return f"mesh {shape}"
        links = ", ".join(f"axis {a} on {hw.link(k)[0] / 1e9:g} GB/s" for a, k in enumerate(self.links))
        return f"mesh {shape} ({links})"


def check_devices(devices: object) -> int:
    if not isinstance(devices, (int, np.integer)) or isinstance(devices, bool) or devices < 1:
        raise SearchError(f"sl.search: devices must be a positive int (the number of ranks to place the model "
                          f"on, e.g. 8), got {devices!r}")
    return int(devices)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_choices(devices: int, hw: Hardware, node_size: int | None = None, max_ndim: int = 2) -> list[MeshChoice]:
    """Every 1-D and 2-D mesh of ``devices`` ranks (no axis of size 1), with every valid link mapping.

    With a single-link Hardware every axis uses link 0; with a plain Hardware of several links, axis
    ``a`` uses link ``a`` (the last for axes beyond). On a Machine with several levels (outer first, like
    ``Machine.h100_cluster`` or ``Hardware.h100_ib``: InfiniBand between nodes, NVLink inside one),
    ``node_size`` ranks share the inner link (default: the machine's devices per node): an axis may use
    the inner link only if its size divides ``node_size``; a mesh that fits in a node (a pipeline stage
    of a node or less) uses the inner link on every axis, since its ranks never leave the node.
    """
    devices = check_devices(devices)
    inner = len(hw.axis_bandwidth) - 1
    if inner > 0 and not isinstance(hw, Machine):
        out = [MeshChoice((devices,), (0,))]
        if max_ndim >= 2:
            out += [MeshChoice((a, devices // a), (0, min(1, inner))) for a in _divisors(devices) if 1 < a < devices]
        return out
    node = node_size or (hw.devices_per_node if isinstance(hw, Machine) else 8)
    if inner == 0:
        out = [MeshChoice((devices,), (0,))]
        if max_ndim >= 2:
            out += [MeshChoice((a, devices // a), (0, 0)) for a in _divisors(devices) if 1 < a < devices]
        return out
    if node % devices == 0:  # one node (a pipeline stage's ranks are node-aligned): every axis on the inner link
        out = [MeshChoice((devices,), (inner,))]
        if max_ndim >= 2:
            out += [MeshChoice((a, devices // a), (inner, inner)) for a in _divisors(devices) if 1 < a < devices]
        return out
    out = [MeshChoice((devices,), (0,))]
    if max_ndim >= 2:
        for a in _divisors(devices):
            b = devices // a
            if not 1 < a < devices:
                continue
            if node % b == 0:
                out.append(MeshChoice((a, b), (0, inner)))
            if node % a == 0:
                out.append(MeshChoice((a, b), (inner, 0)))
            if node % a and node % b:
                out.append(MeshChoice((a, b), (0, 0)))
    return out
