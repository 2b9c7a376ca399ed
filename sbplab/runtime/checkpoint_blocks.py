"""Where each rank's training state lies in the logical tensors a checkpoint stores.

Kept apart from ``checkpoint_dcp`` (the DCP planners), which imports torch.distributed.checkpoint: that
costs about a second, paid only when a checkpoint is saved or loaded, not by ``import sbplab``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

STEPS_KEY = "sbplab.steps"  # a 0-d int64 tensor: training steps done when the checkpoint was written


@dataclass(frozen=True)
class ShardBlock:
    """Where one rank's State lives in its logical tensor.

    name: the State actor's name on that rank; key: the logical (checkpoint) name;
    size: the logical tensor's shape; offsets: where the block starts in it; shape: the block's shape.
    write: whether this State is saved (False for a second copy of a key under another layout, a tied
    parameter on another pipeline stage: the first layout's blocks already cover the tensor).
    pieces: for a strided split ``S(d, chunks=k)``, whose local value is k blocks of the logical tensor
    (its slice of each chunk, end to end along d), one ``Piece`` per block; empty when the local value
    is the one block ``offsets``/``shape`` say.
    """

    name: str
    key: str
    size: tuple[int, ...]
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    write: bool = True
    pieces: tuple[Piece, ...] = ()

    def parts(self) -> tuple[Piece, ...]:
        """The blocks DCP stores for this State: its pieces, or the whole local value as one."""
        return self.pieces or (Piece(self.offsets, (0,) * len(self.shape), self.shape),)


@dataclass(frozen=True)
class Piece:
    """One rectangular block of a State's local value: where it starts in the logical tensor
    (``offsets``), where in the local value (``local``), and its ``shape``."""

    offsets: tuple[int, ...]
    local: tuple[int, ...]
    shape: tuple[int, ...]

    def view(self, t: torch.Tensor) -> torch.Tensor:
        """This block of local value ``t`` (a view: writing it writes ``t``)."""
        for d, (s, n) in enumerate(zip(self.local, self.shape)):
            t = t.narrow(d, s, n)
        return t
