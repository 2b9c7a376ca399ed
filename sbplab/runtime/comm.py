"""torch.distributed for the runtime: one process group per collective group, operations posted
asynchronously by their boxing kinds.

Groups are created once per cluster (every worker creates the same missing groups in the same
canonical order, as ``new_group`` requires) and kept across runs. Gloo serves CPU plans, NCCL
CUDA plans. What an operation does on the wire (all-gather, reduce-scatter, send, ...) is its
kind's business (``sbplab.boxing.kinds``): ``post`` hands the actor to its kind, which returns a
``Pending``: ``wait()`` blocks until it is done and returns the output tensor (on CUDA it only makes
the current stream wait, NCCL's semantics), and ``nbytes`` is the bytes this rank sends, the same
number the plan reports.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from ..boxing.kinds import Pending, StepKind, kind_of
from .specs import Actor, Collective

__all__ = ["Comm", "Pending", "backend_for", "kind_for"]


def kind_for(a: Actor) -> StepKind:
    """The boxing kind that runs communication actor ``a`` (a Collective's ``kind_``; Send/Recv move)."""
    return kind_of(a.kind_ if isinstance(a, Collective) else "send_recv")


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


class Comm:
    """This rank's view of the process groups of one cluster."""

    def __init__(self, rank: int, world_size: int, device_type: str, device: torch.device) -> None:
        self.rank, self.world_size = rank, world_size
        self.device_type, self.device = device_type, device
        self.groups: dict[tuple, object] = {}

    @staticmethod
    def init(rank: int, world_size: int, device_type: str, init_method: str | None,
             timeout_s: float = 1800.0, store: object | None = None) -> None:
        """Join the world group through ``store`` (a spawned cluster's private FileStore) or ``init_method``
        (e.g. env:// under torchrun)."""
        kw: dict = {"store": store} if store is not None else {"init_method": init_method}
        if device_type == "cuda":
            kw["device_id"] = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(backend_for(device_type), rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kw)

    def ensure_groups(self, groups: list[tuple[int, ...]], pairs: list[tuple[int, int]]) -> None:
        """Create missing groups; every rank calls this with the same lists (a collective call)."""
        world = tuple(range(self.world_size))
        for g in groups:
            key = ("group",) + tuple(g)
            if key not in self.groups:
                self.groups[key] = dist.group.WORLD if tuple(g) == world else \
                    dist.new_group(list(g), sort_ranks=False)
        for a, b in pairs:
            key = ("pair", a, b)
            if key not in self.groups:
                # Gloo matches point-to-point messages by tag on the world group; NCCL gets one
                # communicator per pair so that pipeline traffic never queues behind collectives.
                self.groups[key] = dist.new_group([a, b]) if self.device_type == "cuda" else dist.group.WORLD

    # --- posting ----------------------------------------------------------------------------------
    def post(self, a: Actor, x: torch.Tensor | None, micro_batches: int, micro: int,
             inplace: bool = False) -> Pending:
        """Start ``a``'s operation; ``inplace`` lets a kind that allows it overwrite an input nobody else
        reads. Point-to-point messages are matched by a tag unique per (transfer, micro-batch)."""
        tag = getattr(a, "tag", 0) * micro_batches + max(micro, 0)
        return kind_for(a).start(self, a, x, tag=tag, inplace=inplace)
