"""CollectiveKind: a step the ranks of one mesh-axis group do together with one collective, posted
on a ``Communicator`` (``sbplab.runtime.communicators``: Gloo for CPU plans, NCCL for CUDA ones,
in-process for every rank held in one process). The kind says which buffers and pieces travel; how
a backend moves them (and its quirks) is the communicator's business.

Posting is asynchronous: ``start`` returns a ``Pending`` whose ``wait()`` finishes the output; on CUDA
that only makes the current stream wait (NCCL's semantics). A collective never writes into its input
register unless the runtime says nobody else reads it (``inplace``, only for kinds with
``in_place_ok``). The bytes the Pending reports are ``actor_bytes``, the same arithmetic the plan
used, so the plan, the actor spec and the trace carry one number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from ...layout import balanced_sizes, numel
from .kind_base import Pending, StepKind

Finish = Callable[[], torch.Tensor]


def rest_of(shape: Sequence[int], dim: int) -> int:
    """Elements per index of ``dim``: the product of the other dims."""
    return numel([s for d, s in enumerate(shape) if d != dim])


def even_sizes(n: int, p: int, what: str) -> tuple[int, ...]:
    if n < p:
        raise ValueError(f"collective {what!r}: cannot split {n} elements over {p} ranks")
    return tuple(balanced_sizes(n, p))


def pad0(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` (pieces along dim 0) padded with zeros to ``n`` rows, contiguous."""
    if t.shape[0] == n:
        return t.contiguous()
    out = torch.zeros((n,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


class CollectiveKind(StepKind):
    """A ring collective on one mesh axis: ``ring_rounds * (p - 1)`` latency steps."""

    is_collective = True
    moves_data = True
    lowering = "collective"
    ring_rounds: ClassVar[int] = 1

    def rounds(self, group_size: int, messages: int = 1) -> int:
        return self.ring_rounds * max(group_size - 1, 0)

    def actor_bytes(self, actor: Any, me: int, shape: Sequence[int], itemsize: int) -> int:
        """Bytes group member ``me`` sends when ``actor`` runs on its local input of ``shape``: what the
        runtime reports and the simulator prices, for a plan that does not carry the number itself."""
        raise NotImplementedError(f"boxing kind {self.name!r} does not say its actor's bytes")

    def actor_output_shape(self, actor: Any, me: int, shape: Sequence[int]) -> tuple[int, ...]:
        """The local output shape of group member ``me`` for a local input of ``shape`` (the simulator
        follows register shapes through a plan with it)."""
        return tuple(shape)

    def launch(self, actor: Any, x: torch.Tensor, comm: Any, group: tuple[int, ...], p: int, me: int,
               inplace: bool) -> tuple[object, Finish]:
        """Post the collective on ``comm`` (a ``Communicator``): (its ``Work``, what turns its buffers into
        the output)."""
        raise NotImplementedError(f"boxing kind {self.name!r} has no collective to post")

    def start(self, comm: Any, actor: Any, x: torch.Tensor | None, tag: int = 0,
              inplace: bool = False) -> Pending:
        assert x is not None
        p = len(actor.group)
        if p == 1:
            return Pending(None, lambda: x.clone(), 0)
        group = tuple(actor.group)
        me = group.index(comm.rank)
        work, finish = self.launch(actor, x, comm, group, p, me, inplace and self.in_place_ok)
        return Pending(work, finish, self.actor_bytes(actor, me, tuple(x.shape), x.element_size()))

    def run_in_process(self, step, shards, shape, world=None) -> dict[int, torch.Tensor]:
        """Every member of every group posts this kind's collective on its in-process communicator, as a
        worker does on Gloo; the world moves the tensors between the members' buffers."""
        from .in_process_run import run_collective

        return run_collective(self, step, shards, shape, world)
