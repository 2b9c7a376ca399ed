"""A worker's side of ``cluster.save`` and ``cluster.load``: it writes or reads its own blocks with DCP.

Between runs, the driver sends every worker a ``("checkpoint", CheckpointRequest)``; each one calls
DCP (a collective over the cluster's default process group) and answers ``("checkpoint", rank,
payload)``, or ``("checkpoint_error", rank, traceback)`` and stays up: DCP gathers a failure of any
rank to every rank, so the ranks leave the call together and stay in step.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch

from .checkpoint_blocks import ShardBlock


@dataclass
class CheckpointRequest:
    """op: "save" or "load"; path: the checkpoint folder; blocks: this rank's States and where they lie.

    save: the values are the ones this worker keeps under ``tag`` (its last run's final State values),
    or ``values`` when the driver ships its copy (fresh workers); steps: the step count written with them.
    load: the values read are kept under ``tag``: the next run of the step starts from them."""

    op: str
    path: str
    blocks: list[ShardBlock]
    tag: int | None = None
    values: dict[str, torch.Tensor] | None = None
    steps: int = 0


def serve_checkpoint(worker: Any, req: CheckpointRequest) -> tuple:
    """Do ``req`` on this worker (a ``worker_main.Worker``); the reply for the driver."""
    from .checkpoint_dcp import read_blocks, write_blocks  # torch.distributed.checkpoint: loaded when used

    try:
        if req.op == "save":
            values = req.values
            if values is None:
                kept = worker.kept
                if kept is None or kept[0] != req.tag:
                    raise RuntimeError(f"rank {worker.rank}: asked to save the state kept under {req.tag}, "
                                       f"but this worker keeps {kept[0] if kept else 'none'}")
                values = kept[1]
            write_blocks(req.path, values, [b for b in req.blocks if b.write], req.steps)
            return ("checkpoint", worker.rank, None)
        values, steps = read_blocks(req.path, req.blocks, worker.device)
        worker.kept = (req.tag, values)
        return ("checkpoint", worker.rank, ({n: v.to("cpu", copy=True) for n, v in values.items()}, steps))
    except BaseException:  # noqa: BLE001 - it goes back to the driver; the worker stays up
        return ("checkpoint_error", worker.rank, traceback.format_exc())
