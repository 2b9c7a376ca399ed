"""Broadcast: one rank's value to every rank of a group. The planner never picks it (no one-axis SBP
change needs it); hand-written actor plans use it, and the runtime and simulator price it here."""

from __future__ import annotations

import torch

from .collective_kind import CollectiveKind, numel
from .kind_registry import register


class BroadcastKind(CollectiveKind):
    """Rank ``src`` sends its whole tensor (a pipelined ring: p - 1 latency steps); the others send 0."""

    name = "broadcast"
    has_root = True

    def explain(self, old, new, axis_label: str) -> str:
        return f"every rank on {axis_label} receives the source rank's value"

    def value_of(self, xs: list[torch.Tensor], src_index: int) -> list[torch.Tensor]:
        """In one process: every member's result, the source member's value."""
        return [xs[src_index].clone() for _ in xs]

    def actor_bytes(self, actor, me, shape, itemsize) -> int:
        return numel(shape) * itemsize if actor.group[me] == actor.src else 0

    def launch(self, actor, x, comm, group, p, me, inplace):
        y = x.clone() if comm.rank == actor.src else torch.empty_like(x)
        work = comm.broadcast(y, actor.src, group)
        return work, lambda: y


register(BroadcastKind())
