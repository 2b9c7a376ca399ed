"""Communicator: the one interface the boxing kinds talk to, whatever moves the bytes.

Modelled on c10d's ``ProcessGroup``/``Backend`` split and DTensor's functional collectives: a kind
says *what* travels (which buffer, which pieces, which reduce op) and a communicator says *how* on
its backend (Gloo, NCCL, or ranks held in one process). Every operation is asynchronous and returns
a ``Work``; ``wait()`` makes its output buffer valid (on CUDA for the current stream, NCCL's
semantics). Backend quirks (Gloo has no AVG, NCCL ignores p2p tags, which handles can be polled)
live here and in ``Capabilities``, never in a kind.

Groups are tuples of global ranks in mesh-axis order; ``ensure_groups`` creates the missing ones (a
collective call: every rank passes the same lists) and ``group``/``pair`` look them up.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ...errors import SbplabError
from .streams import Streams

Ranks = tuple[int, ...]


class CommunicatorError(SbplabError, RuntimeError):
    """A communicator was asked for something it cannot do: an unknown group, an unsupported reduce op,
    a wait that can never finish (ranks held in one process that did not all post)."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, asked instead of comparing backend names.

    reduce_ops: reduce ops it runs natively; ``avg`` outside it is run as a sum then a division.
    uneven_all_gather: gathers pieces of different sizes without padding them to the largest.
    tagged_p2p: point-to-point messages are matched by tag (else by posting order per peer pair).
    unpolled: operations whose handle cannot be asked whether it is done, only waited for.
    wait_blocks_cpu: ``wait()`` blocks the calling thread (Gloo, in-process); NCCL's only makes the
        current stream wait, so an operation is finished for the CPU once posted.
    record_streams: tensors handed to an asynchronous operation must be recorded on the comm stream
        so the caching allocator does not reuse them while it runs (CUDA).
    """

    reduce_ops: frozenset[str] = frozenset({"sum", "max", "min", "avg"})
    uneven_all_gather: bool = False
    tagged_p2p: bool = True
    unpolled: frozenset[str] = frozenset()
    wait_blocks_cpu: bool = True
    record_streams: bool = False

    def pollable(self, op: str) -> bool:
        """True when ``op``'s handle answers ``is_completed()`` before it is waited for."""
        return op not in self.unpolled


@dataclass(eq=False)
class Work:
    """An operation in flight: ``inner`` (a backend handle, or None once complete), ``after`` a finishing
    touch run once when waited for (a division for an emulated average), ``pollable`` whether
    ``is_completed`` may be asked before ``wait``."""

    inner: object | None
    op: str
    pollable: bool = True
    after: Callable[[], None] | None = None
    _finished: bool = field(default=False, repr=False)

    def wait(self) -> None:
        if self._finished:
            return
        if self.inner is not None:
            self.inner.wait()  # type: ignore[attr-defined]
        if self.after is not None:
            self.after()
        self._finished = True

    def is_completed(self) -> bool:
        return self._finished or self.inner is None or bool(self.inner.is_completed())  # type: ignore[attr-defined]


class Communicator(abc.ABC):
    """This rank's communication: collectives on groups, point-to-point to peers, streams, capabilities.

    Every collective takes ``group`` (a tuple of global ranks, created by ``ensure_groups``) and
    buffers allocated by the caller, as c10d does; the output is valid after ``Work.wait()``.
    """

    backend: str = ""
    caps: Capabilities = Capabilities()

    def __init__(self, rank: int, world_size: int, device: torch.device) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device

    def __repr__(self) -> str:
        return f"<{self.backend} communicator rank {self.rank} of {self.world_size}>"

    # --- groups -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def ensure_groups(self, groups: Sequence[Sequence[int]], pairs: Sequence[tuple[int, int]] = ()) -> None:
        """Create the missing collective groups and point-to-point pairs (every rank, same lists)."""

    @abc.abstractmethod
    def has_group(self, ranks: Sequence[int]) -> bool:
        """True when ``ranks`` (in this order) is a group ``ensure_groups`` created."""

    @abc.abstractmethod
    def group(self, ranks: Sequence[int]) -> object:
        """The backend's handle of group ``ranks`` (a c10d ``ProcessGroup``; the rank tuple in one process),
        for code that needs the backend itself (``DeviceMesh``, checkpointing)."""

    def check_group(self, ranks: Sequence[int], what: str) -> Ranks:
        g = tuple(int(r) for r in ranks)
        if not self.has_group(g):
            raise CommunicatorError(f"{what} on ranks {g}: no such group on {self!r}; call ensure_groups with it "
                                    f"first (every rank, same lists)")
        if self.rank not in g:
            raise CommunicatorError(f"{what} on ranks {g}: rank {self.rank} is not a member")
        return g

    def check_op(self, op: str, what: str) -> None:
        if op not in ("sum", "max", "min", "avg"):
            raise CommunicatorError(f"{what}: reduce op {op!r} is not one of sum, max, min, avg")

    # --- collectives --------------------------------------------------------------------------------
    @abc.abstractmethod
    def all_reduce(self, t: torch.Tensor, op: str, group: Sequence[int]) -> Work:
        """Reduce ``t`` over the group, in place (every member gets the result)."""

    @abc.abstractmethod
    def all_gather(self, out: torch.Tensor, x: torch.Tensor, group: Sequence[int]) -> Work:
        """``out`` (p * rows of ``x``, dim 0) receives every member's ``x`` in group order; equal pieces."""

    @abc.abstractmethod
    def reduce_scatter(self, out: torch.Tensor, x: torch.Tensor, op: str, group: Sequence[int]) -> Work:
        """``x`` is p equal pieces along dim 0; member i's ``out`` receives piece i reduced over the group."""

    @abc.abstractmethod
    def all_to_all(self, out: torch.Tensor, x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int],
                   group: Sequence[int]) -> Work:
        """Flat buffers: piece j of ``x`` (``in_splits[j]`` elements) goes to member j, whose ``out`` holds
        the pieces it receives in sender order (``out_splits``)."""

    @abc.abstractmethod
    def broadcast(self, t: torch.Tensor, src: int, group: Sequence[int]) -> Work:
        """Global rank ``src``'s ``t`` into every member's ``t``."""

    # --- point to point -----------------------------------------------------------------------------
    @abc.abstractmethod
    def send(self, t: torch.Tensor, peer: int, tag: int = 0) -> Work:
        """Post contiguous ``t`` to global rank ``peer``; keep ``t`` alive until waited for."""

    @abc.abstractmethod
    def recv(self, t: torch.Tensor, peer: int, tag: int = 0) -> Work:
        """Receive from ``peer`` into ``t``."""

    # --- streams ------------------------------------------------------------------------------------
    def streams(self) -> Streams:
        """The compute and comm streams of the runtime's two lanes (no-ops off CUDA)."""
        return Streams(self.device)
