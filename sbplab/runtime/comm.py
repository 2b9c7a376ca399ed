"""A worker's communication: its ``Communicator`` (``communicators/``: Gloo for CPU plans, NCCL for
CUDA ones) and the posting of communication actors through their boxing kinds.

Groups are created once per cluster (every worker creates the same missing groups in the same
canonical order, as ``new_group`` requires) and kept across runs. What an operation does on the
wire (all-gather, reduce-scatter, send, ...) is its kind's business (``sbplab.boxing.kinds``), how
the backend does it the communicator's: ``post`` hands the actor to its kind, which posts on the
communicator and returns a ``Pending``: ``wait()`` blocks until it is done and returns the output
tensor (on CUDA it only makes the current stream wait, NCCL's semantics), and ``nbytes`` is the
bytes this rank sends, the same number the plan reports.
"""

from __future__ import annotations

import torch

from ..boxing.kinds import Pending, StepKind, kind_of
from .communicators import Communicator, backend_for, communicator_for, init_world
from .specs import Actor, Collective

__all__ = ["Comm", "Pending", "backend_for", "kind_for"]


def kind_for(a: Actor) -> StepKind:
    """The boxing kind that runs communication actor ``a`` (a Collective's ``kind_``; Send/Recv move)."""
    return kind_of(a.kind_ if isinstance(a, Collective) else "send_recv")


class Comm:
    """This rank's communicator, and the posting of actors on it."""

    def __init__(self, rank: int, world_size: int, device_type: str, device: torch.device,
                 communicator: Communicator | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.device_type, self.device = device_type, device
        self.communicator = communicator or communicator_for(device_type, rank, world_size, device)

    @staticmethod
    def init(rank: int, world_size: int, device_type: str, init_method: str | None,
             timeout_s: float = 1800.0, store: object | None = None) -> None:
        """Join the world group through ``store`` (a spawned cluster's private FileStore) or ``init_method``
        (e.g. env:// under torchrun)."""
        device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else None
        init_world(backend_for(device_type), rank, world_size, init_method, timeout_s, store, device)

    def ensure_groups(self, groups: list[tuple[int, ...]], pairs: list[tuple[int, int]]) -> None:
        """Create missing groups; every rank calls this with the same lists (a collective call)."""
        self.communicator.ensure_groups(groups, pairs)

    # --- posting ----------------------------------------------------------------------------------
    def post(self, a: Actor, x: torch.Tensor | None, micro_batches: int, micro: int,
             inplace: bool = False) -> Pending:
        """Start ``a``'s operation; ``inplace`` lets a kind that allows it overwrite an input nobody else
        reads. Point-to-point messages are matched by a tag unique per (transfer, micro-batch)."""
        tag = getattr(a, "tag", 0) * micro_batches + max(micro, 0)
        return kind_for(a).start(self.communicator, a, x, tag=tag, inplace=inplace)
