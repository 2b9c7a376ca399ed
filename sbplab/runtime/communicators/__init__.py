"""Communicators: what the boxing kinds post their operations on (``base.Communicator``), one file per
backend: Gloo (CPU workers), NCCL (CUDA workers), in-process (every rank in this process, for the
in-process executor and tests). ``communicator_for`` picks the worker's one by device type."""

from __future__ import annotations

import torch

from .gloo import GlooCommunicator
from .in_process import InProcessCommunicator, InProcessWorld
from .interface import Capabilities, Communicator, CommunicatorError, Work
from .nccl import NcclCommunicator
from .streams import Streams
from .torch_dist import init_world

BACKENDS: dict[str, type[Communicator]] = {"gloo": GlooCommunicator, "nccl": NcclCommunicator}


def backend_for(device_type: str) -> str:
    """The torch.distributed backend of a device type: NCCL for CUDA, Gloo otherwise."""
    return "nccl" if device_type == "cuda" else "gloo"


def communicator_for(device_type: str, rank: int, world_size: int, device: torch.device) -> Communicator:
    """This worker's communicator over the initialized default process group."""
    return BACKENDS[backend_for(device_type)](rank, world_size, device)


__all__ = ["BACKENDS", "Capabilities", "Communicator", "CommunicatorError", "GlooCommunicator",
           "InProcessCommunicator", "InProcessWorld", "NcclCommunicator", "Streams", "Work", "backend_for",
           "communicator_for", "init_world"]
