"""Measure collectives and point-to-point moves on the real workers, and fit alpha-beta per kind and axis.

Alpa profiles each collective per mesh axis because the same bytes cost differently over different
links (and, on a CPU box, over different numbers of processes sharing the cores). So for every mesh
axis the cluster can form (the whole world as one axis; for n = a * b ranks also the groups of an
(a, b) mesh's axes 0 and 1, which on 4 ranks are the 2-rank groups of a 2x2 mesh) and every collective
kind, one ordinary ActorPlan sweeps the sizes: State (a tensor of that size) -> Collective, chained so
that transfers never overlap (``calibration_common``). The time of a firing is the fastest member's
(the last to arrive sees the transfer, not the wait), the bytes are what the runtime says its busiest
rank sent, and the ring steps are the boxing kind's own ``rounds`` (the same terms the planner and the
simulator multiply alpha by). Point to point is a ping-pong between ranks 0 and 1: half a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..boxing.kinds import KINDS, kind_of
from ..hardware import CommFit
from ..placement import Placement
from .actor_plan import ActorPlan
from .calibrate_fit import fit_alpha_beta
from .calibration_common import (
    SPIN,
    WARMUP_STEPS,
    close_step,
    firing_seconds,
    gate,
    median,
    run_measurement,
    tick,
)
from .specs import Actor, Collective, Compute, Recv, Send, State
from .trace import Trace

ITEM = 4  # bytes of a float32 element: every sweep moves float32 tensors


def measured_kinds() -> tuple[str, ...]:
    """Every registered boxing kind that runs as a collective: each is measured (a new kind too)."""
    return tuple(name for name, k in KINDS.items() if k.is_collective)


@dataclass(frozen=True)
class AxisGroups:
    """The rank groups that talk over one mesh axis of a mesh the cluster can form."""

    axis: int
    groups: tuple[tuple[int, ...], ...]

    @property
    def group_size(self) -> int:
        return len(self.groups[0])


def comm_axes(n: int) -> list[AxisGroups]:
    """The (axis, groups) settings ``n`` ranks can measure: the world as mesh axis 0, and, when ``n``
    factors as a * b (a, b >= 2, a the smallest factor), both axes of the (a, b) mesh."""
    if n < 2:
        return []
    out = [AxisGroups(0, (tuple(range(n)),))]
    a = next((f for f in range(2, n) if n % f == 0), None)
    if a is not None:
        mesh = Placement("cpu", np.arange(n).reshape(a, n // a).tolist())
        out += [AxisGroups(axis, tuple(mesh.groups(axis))) for axis in (0, 1)]
    return out


def _input(nbytes: int, p: int) -> tuple[torch.Tensor, dict]:
    """A float32 ``(p, m)`` tensor of about ``nbytes`` per rank, and the Collective fields, that every
    measured kind accepts over ``p`` ranks: dim 0 splits evenly (reduce-scatter, all-to-all send rows),
    all-to-all joins the received pieces along dim 1, all-gather stacks along dim 0."""
    return torch.ones(p, max(1, nbytes // ITEM // p)), {"dim": 0, "cat_dim": 1}


def collective_plan(kind: str, setting: AxisGroups, sizes: tuple[int, ...], n: int,
                    device_type: str, spins: int = 0) -> ActorPlan:
    """Every group of ``setting`` runs ``kind`` once per size per step, one size after another;
    ``spins``: every rank computes beside it (``close_step``)."""
    if kind not in measured_kinds():
        raise ValueError(f"calibration: cannot measure collective kind {kind!r}; "
                         f"measured kinds: {measured_kinds()}")
    ranks: dict[int, list[Actor]] = {}
    for group in setting.groups:
        p = len(group)
        for r in group:
            acts: list[Actor] = [tick()]
            prev = "tick"
            for i, size in enumerate(sizes):
                x, fields = _input(size, p)
                acts += [State(f"x{i}", init=x), gate(f"g{i}", f"x{i}", prev),
                         Collective(f"c{i}", kind_=kind, group=group, inputs=(f"g{i}",), scope="step",
                                    registers=1, src=group[0], **fields)]
                prev = f"c{i}"
            ranks[r] = close_step(acts, prev, spins)
    busy = "-busy" if spins else ""
    return ActorPlan.build(n, ranks, device_type=device_type,
                           name=f"calibrate-{kind}-axis{setting.axis}-p{setting.group_size}{busy}")


def sent_bytes(trace: Trace, actor: str) -> int:
    """Bytes the busiest rank sent in one steady firing of ``actor`` (the runtime's own count)."""
    return max((e.bytes for e in trace.events if e.actor == actor and e.step >= WARMUP_STEPS), default=0)


def measure_collective(cluster, kind: str, setting: AxisGroups, sizes: tuple[int, ...],
                       repeats: int) -> CommFit:
    """Sweep ``sizes`` (bytes per rank) of ``kind`` on ``setting``'s groups and fit alpha-beta."""
    plan = collective_plan(kind, setting, sizes, cluster.n, cluster.device_type)
    trace = run_measurement(cluster, plan, repeats, timeout=120.0)
    points = []
    for i in range(len(sizes)):
        samples = [t for g in setting.groups for t in firing_seconds(trace, f"c{i}", g)]
        points.append((sent_bytes(trace, f"c{i}"), median(samples, f"{kind} c{i}")))
    rounds = kind_of(kind).rounds(setting.group_size)
    return fit_alpha_beta(kind, setting.axis, setting.group_size, rounds, points)


def measure_collectives(cluster, sizes: tuple[int, ...], repeats: int) -> list[CommFit]:
    """Every collective kind on every axis setting the cluster can form."""
    return [measure_collective(cluster, kind, setting, sizes, repeats)
            for setting in comm_axes(cluster.n) for kind in measured_kinds()]


def p2p_plan(sizes: tuple[int, ...], n: int, device_type: str, burst_us: float = 0.0) -> ActorPlan:
    """Rank 0 sends each size to rank 1 (``ping{i}``), which sends it straight back (``pong{i}``).

    ``burst_us``: every pair of ranks (2j, 2j + 1) plays the same game at once, and each reply waits
    for a compute burst of that many us (``spin{i}``) and is followed by another (``rest{i}``), as a
    pipeline stage computes between its receive and its send and goes on with the next micro-batch:
    the bursts keep the cores busy while the messages arrive."""
    pairs = [(a, a + 1) for a in range(0, n - 1, 2)] if burst_us else [(0, 1)]
    ranks: dict[int, list[Actor]] = {}
    for a, b in pairs:
        ping, pong = [tick()], []
        prev = "tick"
        for i, size in enumerate(sizes):
            x = torch.ones(max(1, size // ITEM))
            ping += [State(f"x{i}", init=x), gate(f"g{i}", f"x{i}", prev),
                     Send(f"ping{i}", inputs=(f"g{i}",), peer=b, tag=2 * i, scope="step", registers=1),
                     Recv(f"pong{i}", peer=b, tag=2 * i + 1, shape=tuple(x.shape), scope="step", registers=1)]
            reply = f"ping{i}"
            if burst_us:  # compute, reply, compute on: the reply's wake-ups find this core busy
                pong += [Compute(f"spin{i}", op=SPIN, inputs=(reply,), attrs={"us": burst_us}, scope="step",
                                 registers=1),
                         Compute(f"rest{i}", op=SPIN, inputs=(f"spin{i}",), attrs={"us": burst_us}, scope="step",
                                 registers=1)]
                reply = f"spin{i}"
            pong += [Recv(f"ping{i}", peer=a, tag=2 * i, shape=tuple(x.shape), scope="step", registers=1),
                     Send(f"pong{i}", inputs=(reply,), peer=a, tag=2 * i + 1, scope="step", registers=1)]
            prev = f"pong{i}"
        ranks[a], ranks[b] = close_step(ping, prev), pong
    return ActorPlan.build(n, ranks, device_type=device_type,
                           name="calibrate-send-recv" + ("-busy" if burst_us else ""))


def message_seconds(trace: Trace, i: int) -> dict[int, float]:
    """Per steady step, half of game ``i``'s round trip on rank 0 (ping posted to pong received), with the
    responder's compute burst before its reply (``spin{i}``, if any) taken off: one message's time."""
    sent = {e.step: e for e in trace.select(rank=0, actor=f"ping{i}") if e.step >= WARMUP_STEPS}
    back = {e.step: e for e in trace.select(rank=0, actor=f"pong{i}") if e.step >= WARMUP_STEPS}
    burst = {e.step: e.dur for e in trace.select(rank=1, actor=f"spin{i}")}
    return {s: (back[s].end - sent[s].start - burst.get(s, 0.0)) / 2e6 for s in sorted(sent) if s in back}


def measure_p2p(cluster, sizes: tuple[int, ...], repeats: int) -> CommFit | None:
    """Half the round trip of each size between ranks 0 and 1, fitted per message; None on 1 rank."""
    if cluster.n < 2:
        return None
    trace = run_measurement(cluster, p2p_plan(sizes, cluster.n, cluster.device_type), repeats, timeout=120.0)
    points = []
    for i, size in enumerate(sizes):
        trips = list(message_seconds(trace, i).values())
        points.append((max(1, size // ITEM) * ITEM, median(trips, f"send_recv ping{i}")))
    return fit_alpha_beta("send_recv", None, 2, kind_of("send_recv").rounds(2, 1), points)
