"""The part Gloo and NCCL share: c10d process groups from ``torch.distributed``, one per collective
group, created once per cluster in one canonical order (as ``new_group`` requires) and kept."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .interface import Communicator, CommunicatorError, Work

OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
# one tensor in, one tensor out: named *_single from torch 2.13 (the *_tensor names warn there), older before
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def init_world(backend: str, rank: int, world_size: int, init_method: str | None, timeout_s: float = 1800.0,
               store: object | None = None, device: torch.device | None = None) -> None:
    """Join the world group through ``store`` (a spawned cluster's private FileStore) or ``init_method``
    (e.g. env:// under torchrun); ``device`` binds NCCL's communicator to this rank's GPU."""
    kw: dict = {"store": store} if store is not None else {"init_method": init_method}
    if device is not None and device.type == "cuda":
        kw["device_id"] = device
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)


class TorchDistCommunicator(Communicator):
    """A communicator over the default process group of ``torch.distributed`` and groups made from it."""

    def __init__(self, rank: int, world_size: int, device: torch.device) -> None:
        super().__init__(rank, world_size, device)
        self.groups: dict[tuple[int, ...], object] = {}
        self.pairs: dict[tuple[int, int], object] = {}

    def pair_group(self, a: int, b: int) -> object:
        """The process group point-to-point messages between ``a`` and ``b`` go on."""
        raise NotImplementedError

    def ensure_groups(self, groups: Sequence[Sequence[int]], pairs: Sequence[tuple[int, int]] = ()) -> None:
        world = tuple(range(self.world_size))
        for g in groups:
            key = tuple(int(r) for r in g)
            if key not in self.groups:
                self.groups[key] = dist.group.WORLD if key == world else dist.new_group(list(key), sort_ranks=False)
        for a, b in pairs:
            key = (min(a, b), max(a, b))
            if key not in self.pairs:
                self.pairs[key] = self.pair_group(*key)

    def has_group(self, ranks: Sequence[int]) -> bool:
        return tuple(ranks) in self.groups

    def group(self, ranks: Sequence[int]) -> object:
        return self._pg(ranks, "group")

    def _pg(self, group: Sequence[int], what: str) -> object:
        return self.groups[self.check_group(group, what)]

    def _op(self, op: str, what: str) -> object:
        self.check_op(op, what)
        if op == "avg":
            return dist.ReduceOp.AVG
        return OPS[op]

    def _peer_group(self, peer: int, what: str) -> object:
        key = (min(self.rank, peer), max(self.rank, peer))
        if key not in self.pairs:
            raise CommunicatorError(f"{what} between ranks {key}: no such pair on {self!r}; call ensure_groups "
                                    f"with it first")
        return self.pairs[key]

    def _work(self, inner: object, op: str, after=None) -> Work:
        return Work(inner, op, self.caps.pollable(op), after)

    def all_reduce(self, t, op, group) -> Work:
        return self._work(dist.all_reduce(t, op=self._op(op, "all_reduce"), group=self._pg(group, "all_reduce"),
                                          async_op=True), "all_reduce")

    def all_gather(self, out, x, group) -> Work:
        return self._work(ALL_GATHER_SINGLE(out, x.contiguous(), group=self._pg(group, "all_gather"),
                                                 async_op=True), "all_gather")

    def reduce_scatter(self, out, x, op, group) -> Work:
        return self._work(REDUCE_SCATTER_SINGLE(out, x.contiguous(), op=self._op(op, "reduce_scatter"),
                                                     group=self._pg(group, "reduce_scatter"), async_op=True),
                          "reduce_scatter")

    def all_to_all(self, out, x, out_splits, in_splits, group) -> Work:
        return self._work(dist.all_to_all_single(out, x, list(out_splits), list(in_splits),
                                                 group=self._pg(group, "all_to_all"), async_op=True), "all_to_all")

    def broadcast(self, t, src, group) -> Work:
        return self._work(dist.broadcast(t, src=src, group=self._pg(group, "broadcast"), async_op=True), "broadcast")

    def send(self, t, peer, tag=0) -> Work:
        return self._work(dist.isend(t, dst=peer, group=self._peer_group(peer, "send"), tag=tag), "send")

    def recv(self, t, peer, tag=0) -> Work:
        return self._work(dist.irecv(t, src=peer, group=self._peer_group(peer, "recv"), tag=tag), "recv")
