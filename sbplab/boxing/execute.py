"""Run boxing steps on the shards of all ranks held in one process, through each kind's own code
(``kinds/``): collectives and moves are posted by every rank on its in-process communicator
(``sbplab.runtime.communicators.InProcessWorld``), exactly as the workers post them on Gloo or NCCL,
and local steps run the kernel the workers run. Nothing here ever rebuilds the full tensor, so a
wrong plan gives a wrong value instead of hiding.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import InputError, InputTypeError
from ..layout import LayoutError, local_shape, partial_ok
from ..sbp import fmt_sbp
from .step import BoxingStep


def run_step(step: BoxingStep, shards: Mapping[int, torch.Tensor], shape: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Apply one step (a one-axis step to every group of its axis, or a move) as its kind says."""
    return step.kind_obj.run_in_process(step, shards, shape)


def run_axis_step(step: BoxingStep, shards: Mapping[int, torch.Tensor], shape: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Apply a one-mesh-axis step to every group of that axis."""
    if step.mesh_axis is None:
        raise ValueError(f"{step.kind} is not a one-axis step")
    return run_step(step, shards, shape)


def run_move(step: BoxingStep, shards: Mapping[int, torch.Tensor], shape: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Each destination rank assembles its shard from exactly the regions sent to it."""
    if step.mesh_axis is not None:
        raise ValueError(f"{step.kind} on mesh axis {step.mesh_axis} is not a move between placements")
    return run_step(step, shards, shape)


def check_shards(shards: Mapping[int, torch.Tensor], placement, shape, nd_sbp, dst_sbp=()) -> None:
    """The shards a plan is run on must be exactly the placement's ranks, with the expected local shapes,
    of one dtype that can hold the partials of the source and destination SBPs."""
    if not isinstance(shards, Mapping) or not all(isinstance(t, torch.Tensor) for t in shards.values()):
        raise InputTypeError(f"plan.run needs a dict rank -> torch.Tensor (one shard per rank of {placement}), "
                             f"got {type(shards).__name__}")
    if set(shards) != set(placement.rank_list):
        raise InputError(f"plan.run needs one shard per rank of {placement}: ranks {sorted(placement.rank_list)}, "
                         f"got ranks {sorted(shards)}")
    for r in placement.rank_list:
        want = local_shape(shape, placement, nd_sbp, r)
        if tuple(shards[r].shape) != want:
            raise InputError(f"plan.run: rank {r}'s shard has shape {tuple(shards[r].shape)} but "
                             f"{tuple(shape)} under SBP {fmt_sbp(nd_sbp)} on {placement} gives it {want}")
    dtypes = sorted({str(t.dtype) for t in shards.values()})
    if len(dtypes) > 1:
        raise InputError(f"plan.run: the shards mix dtypes {dtypes}; every rank must hold the same dtype")
    dtype = next(iter(shards.values())).dtype
    for x in (*nd_sbp, *dst_sbp):
        if not partial_ok(x, dtype):
            raise LayoutError(f"plan.run: {dtype} shards cannot be {x!r} (no partial bools, no P(max)/P(min) of "
                              f"complex values); plan a boxing without it")
