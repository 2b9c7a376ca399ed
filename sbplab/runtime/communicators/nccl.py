"""NCCL (CUDA): its quirks, kept here.

- AVG is native;
- ``wait()`` only makes the current stream wait, so an operation is done for the CPU once posted,
  and tensors it uses must be recorded on the comm stream (``Streams.hold``);
- tags are ignored: messages between two ranks match in posting order, so every pair gets its own
  communicator and pipeline traffic never queues behind collectives.
"""

from __future__ import annotations

import torch.distributed as dist

from .interface import Capabilities
from .torch_dist import TorchDistCommunicator


class NcclCommunicator(TorchDistCommunicator):
    backend = "nccl"
    caps = Capabilities(reduce_ops=frozenset({"sum", "max", "min", "avg"}), uneven_all_gather=False,
                        tagged_p2p=False, unpolled=frozenset(), wait_blocks_cpu=False, record_streams=True)

    def pair_group(self, a: int, b: int) -> object:
        return dist.new_group([a, b])
