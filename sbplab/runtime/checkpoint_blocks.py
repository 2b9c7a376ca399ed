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
    """

    name: str
    key: str
    size: tuple[int, ...]
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    write: bool = True
