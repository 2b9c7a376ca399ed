"""StepKind: everything one kind of boxing step means, in one object.

A kind (slice, zero fill, all-gather, ...) is asked by every part of sbplab that meets a boxing step:
the planner for the bytes each rank sends and the time that takes on a ``Hardware``, the explanation
for its one-line reason, the in-process executor for its effect on the shards of a group, lowering
for the actor it becomes, the runtime for what it posts on a ``Communicator``, and the
simulator for its duration. Callers test its properties (``is_collective``, ``moves_data``,
``reduces``, ...) instead of comparing names, so a new kind is one class plus ``register``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ...hardware import Hardware
from ...sbp import SbpParallel

if TYPE_CHECKING:
    from ..step import BoxingStep

Shards = Mapping[int, torch.Tensor]


@dataclass
class Pending:
    """An operation in flight: ``work`` (None when already complete), how to finish it, and the bytes
    this rank sends, the same number the plan and the actor spec carry."""

    work: object | None
    finish: Callable[[], torch.Tensor | None]
    nbytes: int

    def wait(self) -> torch.Tensor | None:
        if self.work is not None:
            self.work.wait()  # type: ignore[attr-defined]
        return self.finish()


def kernel_ref(fn: Callable) -> str:
    """The ``"module:function"`` name a worker imports a kernel by."""
    return f"{fn.__module__}:{fn.__name__}"


class StepKind:
    """One kind of boxing step. Subclasses set ``name`` and the properties, and override what applies.

    Properties, so that callers never compare names:
    - ``is_collective``: runs as one collective (a ``Communicator`` call) on the ranks of a group;
    - ``moves_data``: bytes leave a rank (False for local slices and fills, and same-rank copies);
    - ``reduces``: combines the group's values with a reduce op (its label shows the op);
    - ``between_placements``: a move from one placement to another, not a step on one mesh axis;
    - ``in_place_ok``: the runtime may let it overwrite an input register only it reads;
    - ``lowering``: the actor it becomes: "collective", "kernel" (a local Compute) or "p2p" (Send/Recv);
    - ``has_root``: one rank (a Collective's ``src``) holds the value the others receive;
    - ``bucket_layout``: how gradients share one run of it (``bucket_kernels``): "flat" (one
      concatenation), "regions" (one region per rank), None (never bucketed).

    Which backend operations can be polled, and every other backend quirk, is the communicator's
    business (``sbplab.runtime.communicators``), not the kind's.
    """

    name: ClassVar[str] = ""
    is_collective: ClassVar[bool] = False
    moves_data: ClassVar[bool] = False
    reduces: ClassVar[bool] = False
    between_placements: ClassVar[bool] = False
    in_place_ok: ClassVar[bool] = False
    lowering: ClassVar[str] = "kernel"
    has_root: ClassVar[bool] = False
    bucket_layout: ClassVar[str | None] = None

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<boxing kind {self.name}>"

    @property
    def is_local(self) -> bool:
        """Nothing crosses a rank: the step is a local kernel (or a same-rank copy)."""
        return not self.moves_data

    def label(self, reduce_op: str | None) -> str:
        """How a step of this kind is named in tables: ``all_reduce(max)``, ``all_gather``."""
        return f"{self.name}({reduce_op})" if self.reduces and reduce_op else self.name

    # --- which one-axis transitions it makes --------------------------------------------------------
    def turns(self, old: SbpParallel, new: SbpParallel) -> bool:
        """True when this kind turns ``old`` into ``new`` on one mesh axis (BRIEF's table)."""
        return False

    # --- bytes and time -----------------------------------------------------------------------------
    def rank_elements(self, piece: Sequence[int], old: SbpParallel, new: SbpParallel, p: int,
                      i: int) -> tuple[int, int, int]:
        """(sent, received, busy) elements of group member ``i`` of ``p``, whose group works on a piece
        of logical shape ``piece``. ``busy`` is what bounds its time: the busier link direction for
        communication, the elements written for a local fill."""
        raise NotImplementedError(f"boxing kind {self.name!r} does not say its bytes")

    def busy_floor(self, T: int, p: int) -> int:
        """A floor under the busiest member's ``busy`` elements (``rank_elements``) when a group of ``p``
        works on pieces of ``T`` elements or more, whatever their shape and split: what a lower bound on a
        route's time may assume without knowing the layouts around the step (``search/box_floors.py``).
        0 unless the kind knows better."""
        return 0

    def rounds(self, group_size: int, messages: int = 1) -> int:
        """Latency terms of one step: ring steps of a collective, messages of a move, 0 for local work."""
        return 0

    def alpha_beta(self, hw: Hardware, mesh_axis: int | None, group_size: int,
                   busy: bool = False) -> tuple[float, float]:
        """(seconds per round, bytes/s) on ``hw``: a calibrated fit for this kind and axis where there is
        one, else the link's spec-sheet figures (``Hardware.alpha_beta``); ``busy``: while every core
        computes."""
        if not self.moves_data:
            return 0.0, hw.mem_bandwidth
        return hw.alpha_beta(self.name, mesh_axis, group_size, busy)

    def duration(self, hw: Hardware, mesh_axis: int | None, group_size: int, bytes_per_rank: float,
                 messages: int = 1, busy: bool = False) -> float:
        """Seconds one step takes on ``hw`` when its busiest rank moves ``bytes_per_rank``: the
        alpha-beta time ``alpha * rounds + bytes / bandwidth`` (what the planner and simulator use);
        ``busy``: while every core of the machine computes (the simulator's contended transfers)."""
        if self.moves_data and group_size <= 1:
            return 0.0
        alpha, bw = self.alpha_beta(hw, mesh_axis, group_size, busy)
        return alpha * self.rounds(group_size, messages) + bytes_per_rank / bw

    # --- words ---------------------------------------------------------------------------------------
    def explain(self, old: SbpParallel, new: SbpParallel, axis_label: str) -> str:
        """A one-line reason for a step, in the words of BRIEF's table."""
        return f"{old!r} -> {new!r} on {axis_label}: {self.name}"

    # --- in one process ------------------------------------------------------------------------------
    def apply(self, step: BoxingStep, group: tuple[int, ...], xs: list[torch.Tensor],
              shape: tuple[int, ...]) -> list[torch.Tensor]:
        """The group's shards after the step (``xs`` and the result in group order)."""
        raise NotImplementedError(f"boxing kind {self.name!r} cannot run in one process")

    def run_in_process(self, step: BoxingStep, shards: Shards, shape: tuple[int, ...],
                       world: Any = None) -> dict[int, torch.Tensor]:
        """Apply the step to every group of its mesh axis, all ranks' shards held in this process
        (collectives and moves post on ``world``'s in-process communicators instead)."""
        out: dict[int, torch.Tensor] = {}
        for group in step.placement.groups(step.mesh_axis):
            for r, y in zip(group, self.apply(step, tuple(group), [shards[r] for r in group], shape)):
                out[r] = y
        return out

    # --- lowering ------------------------------------------------------------------------------------
    def kernel(self, step: BoxingStep, rank: int, in_shape: Sequence[int],
               shape: tuple[int, ...]) -> tuple[Callable, dict[str, Any]]:
        """(kernel, attrs) of the local Compute actor ``rank`` runs (``lowering == "kernel"``)."""
        raise NotImplementedError(f"boxing kind {self.name!r} is not a local kernel")

    def collective_attrs(self, step: BoxingStep, group: tuple[int, ...], in_shape: Sequence[int],
                         shape: tuple[int, ...]) -> dict[str, Any]:
        """The ``Collective`` actor's fields for a member of ``group`` (``lowering == "collective"``)."""
        raise NotImplementedError(f"boxing kind {self.name!r} does not lower to a collective")

    # --- communication ---------------------------------------------------------------------------
    def start(self, comm: Any, actor: Any, x: torch.Tensor | None, tag: int = 0,
              inplace: bool = False) -> Pending:
        """Post ``actor``'s operation on ``comm`` (a ``sbplab.runtime.communicators.Communicator``)."""
        raise NotImplementedError(f"boxing kind {self.name!r} posts no communication")
