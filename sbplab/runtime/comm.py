"""torch.distributed for the runtime: one process group per collective group, posted asynchronously.

Groups are created once per cluster (every worker creates the same missing groups in the same
canonical order, as ``new_group`` requires) and kept across runs. Gloo serves CPU plans, NCCL
CUDA plans. Collectives never write into their input register (other consumers may still read
it), and balanced uneven splits are handled by padding to the largest piece.

``post`` starts an operation and returns a ``Pending``: ``wait()`` blocks until it is done and
returns the output tensor. On CUDA, ``wait()`` only makes the current stream wait (NCCL's
semantics), so a lane never blocks the CPU on the GPU.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .specs import Actor, Collective, Recv, Send

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "avg": dist.ReduceOp.SUM}  # Gloo has no AVG: sum, then divide


@dataclass
class Pending:
    """An operation in flight: ``work`` (None when already complete) and how to finish it."""

    work: object | None
    finish: Callable[[], torch.Tensor | None]
    nbytes: int

    def wait(self) -> torch.Tensor | None:
        if self.work is not None:
            self.work.wait()  # type: ignore[attr-defined]
        return self.finish()


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


class Comm:
    """This rank's view of the process groups of one cluster."""

    def __init__(self, rank: int, world_size: int, device_type: str, device: torch.device) -> None:
        self.rank, self.world_size = rank, world_size
        self.device_type, self.device = device_type, device
        self.groups: dict[tuple, object] = {}

    @staticmethod
    def init(rank: int, world_size: int, device_type: str, init_method: str | None,
             timeout_s: float = 1800.0, store: object | None = None) -> None:
        """Join the world group through ``store`` (a TCPStore) or ``init_method`` (e.g. env://)."""
        kw: dict = {"store": store} if store is not None else {"init_method": init_method}
        if device_type == "cuda":
            kw["device_id"] = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(backend_for(device_type), rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kw)

    def ensure_groups(self, groups: list[tuple[int, ...]], pairs: list[tuple[int, int]]) -> None:
        """Create missing groups; every rank calls this with the same lists (a collective call)."""
        world = tuple(range(self.world_size))
        for g in groups:
            key = ("group",) + tuple(g)
            if key not in self.groups:
                self.groups[key] = dist.group.WORLD if tuple(g) == world else \
                    dist.new_group(list(g), sort_ranks=False)
        for a, b in pairs:
            key = ("pair", a, b)
            if key not in self.groups:
                # Gloo matches point-to-point messages by tag on the world group; NCCL gets one
                # communicator per pair so that pipeline traffic never queues behind collectives.
                self.groups[key] = dist.new_group([a, b]) if self.device_type == "cuda" else dist.group.WORLD

    # --- posting ----------------------------------------------------------------------------------
    def post(self, a: Actor, x: torch.Tensor | None, micro_batches: int, micro: int,
             inplace: bool = False) -> Pending:
        """Start ``a``'s operation; ``inplace`` lets an all-reduce overwrite an input nobody else reads."""
        if isinstance(a, Collective):
            return self._collective(a, x, inplace)  # type: ignore[arg-type]
        tag = a.tag * micro_batches + max(micro, 0)  # type: ignore[attr-defined]
        group = self.groups[("pair",) + tuple(sorted((self.rank, a.peer)))]  # type: ignore[attr-defined]
        if isinstance(a, Send):
            buf = x.contiguous()  # type: ignore[union-attr]
            work = dist.isend(buf, dst=a.peer, group=group, tag=tag)
            return Pending(work, lambda: None, buf.numel() * buf.element_size())
        assert isinstance(a, Recv)
        y = torch.empty(a.shape, dtype=a.dtype, device=self.device)
        work = dist.irecv(y, src=a.peer, group=group, tag=tag)
        return Pending(work, lambda: y, y.numel() * y.element_size())

    def _collective(self, a: Collective, x: torch.Tensor, inplace: bool = False) -> Pending:
        group = self.groups[("group",) + a.group]
        p = len(a.group)
        me = a.group.index(self.rank)
        op = _OPS[a.reduce_op]
        nb = x.numel() * x.element_size()
        avg = (lambda t: t.div_(p)) if a.reduce_op == "avg" else (lambda t: t)
        if p == 1:
            return Pending(None, lambda: x.clone(), 0)
        if a.kind_ == "all_reduce":
            y = x if inplace and x.is_contiguous() else x.clone()
            work = dist.all_reduce(y, op=op, group=group, async_op=True)
            return Pending(work, lambda: avg(y), 2 * nb * (p - 1) // p)
        if a.kind_ == "broadcast":
            y = x.clone() if self.rank == a.src else torch.empty_like(x)
            work = dist.broadcast(y, src=a.src, group=group, async_op=True)
            return Pending(work, lambda: y, nb if self.rank == a.src else 0)
        if a.kind_ == "all_gather":
            xt = x.movedim(a.dim, 0)
            sizes = a.sizes or (xt.shape[0],) * p
            top = max(sizes)
            buf = xt.contiguous() if xt.shape[0] == top else _pad0(xt, top)
            out = torch.empty((p * top,) + tuple(xt.shape[1:]), dtype=x.dtype, device=x.device)
            work = dist.all_gather_single(out, buf, group=group, async_op=True)

            def fin_gather() -> torch.Tensor:
                pieces = [out[i * top: i * top + s] for i, s in enumerate(sizes)]
                return torch.cat(pieces, 0).movedim(0, a.dim).contiguous()
            return Pending(work, fin_gather, nb * (p - 1))
        if a.kind_ == "reduce_scatter":
            xt = x.movedim(a.dim, 0)
            sizes = a.sizes or _even(xt.shape[0], p, a.name)
            top = max(sizes)
            chunks = torch.split(xt, list(sizes), 0)
            buf = torch.cat([_pad0(c, top) for c in chunks], 0) if min(sizes) != top else xt.contiguous()
            out = torch.empty((top,) + tuple(xt.shape[1:]), dtype=x.dtype, device=x.device)
            work = dist.reduce_scatter_single(out, buf, op=op, group=group, async_op=True)
            return Pending(work, lambda: avg(out[: sizes[me]]).movedim(0, a.dim).contiguous(),
                           nb * (p - 1) // p)
        return self._all_to_all(a, x, group, p, me)

    def _all_to_all(self, a: Collective, x: torch.Tensor, group: object, p: int, me: int) -> Pending:
        sizes = a.sizes or _even(x.shape[a.dim], p, a.name)
        cat_sizes = a.cat_sizes or (x.shape[a.cat_dim],) * p
        chunks = torch.split(x, list(sizes), a.dim)
        flat = [c.contiguous().view(-1) for c in chunks]
        in_splits = [f.numel() for f in flat]
        shapes = []
        for q in range(p):
            s = list(x.shape)
            s[a.dim], s[a.cat_dim] = sizes[me], cat_sizes[q]
            shapes.append(s)
        out_splits = [int(torch.Size(s).numel()) for s in shapes]
        out = torch.empty(sum(out_splits), dtype=x.dtype, device=x.device)
        work = dist.all_to_all_single(out, torch.cat(flat), out_splits, in_splits, group=group, async_op=True)

        def fin() -> torch.Tensor:
            pieces = [t.view(s) for t, s in zip(torch.split(out, out_splits), shapes)]
            return torch.cat(pieces, a.cat_dim)
        sent = sum(n for q, n in enumerate(in_splits) if q != me) * x.element_size()
        return Pending(work, fin, sent)


def _pad0(t: torch.Tensor, n: int) -> torch.Tensor:
    if t.shape[0] == n:
        return t.contiguous()
    out = torch.zeros((n,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


def _even(n: int, p: int, name: str) -> tuple[int, ...]:
    from ..layout import balanced_sizes

    if n < p:
        raise ValueError(f"collective {name!r}: cannot split {n} elements over {p} ranks")
    return tuple(balanced_sizes(n, p))
