"""Moves between placements (pipeline stages, other rank counts): ``send_recv`` when data crosses a
rank or a device type, ``copy`` when every region stays where it is.

A move is a set of transfers (a global region from a source rank to a destination rank). In one
process and on the workers alike, a source rank runs ``take_block -> Send`` per transfer and a
destination ``Recv``s plus one ``put_blocks``; each Send/Recv is a tagged point-to-point message on
the rank's ``Communicator`` (in one process, the in-process one). Time: one latency per message plus the
busiest rank's bytes over the point-to-point link (``Hardware.alpha_beta(kind, None)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...layout import local_block
from ...sbp import NdSbp, Partial, fmt_sbp
from .kind_base import Pending, Shards, StepKind
from .kind_registry import register

if TYPE_CHECKING:
    from ...placement import Placement
    from ..step import BoxingStep, Transfer


# --- kernels ----------------------------------------------------------------------------------------
def take_block(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """The region ``take`` ((start, stop) per dim, local coordinates) of the input, contiguous."""
    sl = tuple(slice(a, b) for a, b in attrs["take"])
    return (inputs[0][sl].contiguous(),)


def put_blocks(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Assemble a ``shape`` tensor: input j's region ``takes[j]`` goes to region ``puts[j]``."""
    out = torch.empty(tuple(attrs["shape"]), dtype=inputs[0].dtype, device=inputs[0].device)
    for x, take, put in zip(inputs, attrs["takes"], attrs["puts"]):
        src = x if take is None else x[tuple(slice(a, b) for a, b in take)]
        out[tuple(slice(a, b) for a, b in put)] = src
    return (out,)


def local_region(block, origin_block) -> tuple[tuple[int, int], ...]:
    """A global region in the local coordinates of a shard that holds ``origin_block``."""
    return tuple((s - o, e - o) for (s, e), (o, _) in zip(block, origin_block))


def _has_partial(state: NdSbp) -> bool:
    return any(isinstance(x, Partial) for x in state)


class MoveKind(StepKind):
    """A move from one placement to another, as transfers of regions."""

    between_placements = True
    lowering = "p2p"

    def rounds(self, group_size: int, messages: int = 1) -> int:
        return messages

    def alpha_beta(self, hw, mesh_axis, group_size, busy: bool = False) -> tuple[float, float]:
        return hw.alpha_beta(self.name, None, 2, busy)

    def explain_move(self, x: NdSbp, y: NdSbp, src_pl: Placement, dst_pl: Placement,
                     transfers: tuple[Transfer, ...]) -> str:
        how = ("each shard travels whole to the rank at the same mesh coordinates" if _has_partial(x)
               else f"each rank of the destination receives the parts of its {fmt_sbp(y)} block it does not hold")
        if src_pl.device_type != dst_pl.device_type:
            how += f"; {src_pl.device_type} -> {dst_pl.device_type} is a device copy, counted as bytes moved"
        local = sum(1 for t in transfers if t.src_rank == t.dst_rank)
        if local:
            how += f"; {local} region(s) stay on their rank"
        return f"move to the other placement: {how}"

    def explain(self, old, new, axis_label: str) -> str:
        return "move to the other placement"

    # --- in one process ------------------------------------------------------------------------------
    def run_in_process(self, step: BoxingStep, shards: Shards, shape: tuple[int, ...],
                       world: Any = None) -> dict[int, torch.Tensor]:
        """Each destination rank assembles its shard from exactly the regions sent to it, the messages
        posted on in-process communicators as the workers post them."""
        src_pl, dst_pl = step.src_placement, step.placement
        device = torch.device(dst_pl.device_type or "cpu")  # device-free: this process's CPU
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"this plan moves shards to {dst_pl}, but this process has no CUDA device")
        partial = _has_partial(step.src_sbp)
        for t in step.transfers:
            if partial and local_block(shape, src_pl, step.src_sbp, t.src_rank) != \
                    local_block(shape, dst_pl, step.dst_sbp, t.dst_rank):
                raise RuntimeError("a partial shard can only move whole, to the same block")
        from .in_process_run import run_move

        out = run_move(self, step, shards, shape, device, world)
        for r in dst_pl.rank_list:
            n = sum(t.numel for t in step.transfers if t.dst_rank == r)
            if n != out[r].numel():
                raise RuntimeError(f"move into rank {r} wrote {n} of {out[r].numel()} elements; the transfers "
                                   f"do not tile its block")
        return out

    # --- lowering ------------------------------------------------------------------------------------
    def take_kernel(self, block, src_block) -> tuple[Any, dict]:
        """The kernel a source rank runs to cut out one transfer's region before sending it."""
        return take_block, {"take": local_region(block, src_block)}

    def put_kernel(self, out_shape, takes, puts) -> tuple[Any, dict]:
        """The kernel a destination rank runs to assemble its shard from the received regions."""
        return put_blocks, {"shape": out_shape, "takes": tuple(takes), "puts": tuple(puts)}

    # --- communication -----------------------------------------------------------------------------
    def start(self, comm: Any, actor: Any, x: torch.Tensor | None, tag: int = 0,
              inplace: bool = False) -> Pending:
        """A Send posts ``x`` to its peer, a Recv a buffer of its declared shape (matched by tag)."""
        if actor.kind == "send":
            assert x is not None
            buf = x.contiguous()
            work = comm.send(buf, actor.peer, tag)
            return Pending(work, lambda: None, buf.numel() * buf.element_size())
        y = torch.empty(actor.shape, dtype=actor.dtype, device=comm.device)
        work = comm.recv(y, actor.peer, tag)
        return Pending(work, lambda: y, y.numel() * y.element_size())


class SendRecvKind(MoveKind):
    """Data crosses ranks (or device types): point-to-point messages."""

    name = "send_recv"
    moves_data = True


class CopyKind(MoveKind):
    """Every region stays on its rank and device: a local copy, no message."""

    name = "copy"


register(SendRecvKind())
register(CopyKind())
