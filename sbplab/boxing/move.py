"""Moves between placements (pipeline stages, other rank counts, other mesh shapes).

Two ways to move a tensor from placement A to placement B:
- same mesh shape: rank at coordinates c of A sends its whole shard to rank at c of B, so even a
  partial ``P`` layout survives the trip (its addends travel as they are);
- any shapes: every destination rank receives exactly the intersection of its block with the blocks
  source ranks hold, no partial values on the wire. Where several source ranks hold a block (a B
  axis) the destination's own rank is used if it holds it (a free local copy), else the least
  loaded holder, so broadcast copies spread the sending work.
Only data that leaves a rank (or changes device type) counts as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..hardware import Hardware
from ..layout import Block, local_block
from ..placement import Placement
from ..sbp import NdSbp, Partial
from .kinds import StepKind, kind_of, on_change
from .route import Key
from .step import Transfer
from .ticks import kind_ticks, time_scale


@dataclass(frozen=True)
class Move:
    transfers: tuple[Transfer, ...]
    sent: dict[int, int]  # bytes per source rank (only data that crosses)
    recv: dict[int, int]  # bytes per destination rank
    messages: int  # the most messages one rank sends or receives
    ticks: int  # exact time (see costs.time_scale)
    time_s: float

    @property
    def total(self) -> int:
        return sum(self.sent.values())

    @property
    def key(self) -> Key:
        return (self.ticks, self.total, 1)

    @property
    def kind(self) -> str:
        return move_kind(self.total, self.messages).name


def move_kind(total_bytes: int, messages: int) -> StepKind:
    """``send_recv`` when anything crosses a rank or device, else ``copy``."""
    return kind_of("send_recv" if total_bytes or messages else "copy")


def _intersect(a: Block, b: Block) -> Block | None:
    out = []
    for (s0, e0), (s1, e1) in zip(a, b):
        s, e = max(s0, s1), min(e0, e1)
        if s >= e:
            return None
        out.append((s, e))
    return tuple(out)


def _numel(block: Block) -> int:
    n = 1
    for s, e in block:
        n *= e - s
    return n


def has_partial(state: NdSbp) -> bool:
    return any(isinstance(x, Partial) for x in state)


@lru_cache(maxsize=65536)
def plan_move(shape: tuple[int, ...], src: NdSbp, dst: NdSbp, src_pl: Placement, dst_pl: Placement,
              itemsize: int, hardware: Hardware) -> Move | None:
    """The transfers that turn ``src`` on ``src_pl`` into ``dst`` on ``dst_pl``; None if not allowed."""
    crosses_device = src_pl.device_type != dst_pl.device_type
    transfers: list[Transfer] = []
    if has_partial(src) or has_partial(dst):
        if src != dst or src_pl.shape != dst_pl.shape:
            return None  # partial values only travel 1:1 between meshes of one shape
        for s_rank, d_rank in zip(src_pl.rank_list, dst_pl.rank_list):
            transfers.append(Transfer(s_rank, d_rank, local_block(shape, src_pl, src, s_rank)))
    else:
        holders: dict[Block, list[int]] = {}
        for r in src_pl.rank_list:
            holders.setdefault(local_block(shape, src_pl, src, r), []).append(r)
        load = {r: 0 for r in src_pl.rank_list}
        for d_rank in dst_pl.rank_list:
            want = local_block(shape, dst_pl, dst, d_rank)
            for block, who in holders.items():
                region = _intersect(block, want)
                if region is None:
                    continue
                s_rank = d_rank if d_rank in who else min(who, key=lambda r: load[r])
                if s_rank != d_rank or crosses_device:
                    load[s_rank] += _numel(region)
                transfers.append(Transfer(s_rank, d_rank, region))
    sent = {r: 0 for r in src_pl.rank_list}
    recv = {r: 0 for r in dst_pl.rank_list}
    n_sent = dict.fromkeys(src_pl.rank_list, 0)
    n_recv = dict.fromkeys(dst_pl.rank_list, 0)
    for t in transfers:
        if t.src_rank != t.dst_rank or crosses_device:
            nbytes = t.numel * itemsize
            sent[t.src_rank] += nbytes
            recv[t.dst_rank] += nbytes
            n_sent[t.src_rank] += 1
            n_recv[t.dst_rank] += 1
    messages = max([*n_sent.values(), *n_recv.values()])
    busiest = max([*sent.values(), *recv.values()])
    t = kind_ticks(move_kind(sum(sent.values()), messages), hardware, None, 2, busiest, messages)
    return Move(tuple(transfers), sent, recv, messages, t, t / time_scale(hardware))


def move_lower_bound(shape: tuple[int, ...], dst: NdSbp, src_pl: Placement, dst_pl: Placement,
                     itemsize: int, hardware: Hardware) -> Key:
    """A key no move into ``dst`` can beat: destination ranks outside the source must receive their block."""
    outside = [r for r in dst_pl.rank_list if r not in src_pl or src_pl.device_type != dst_pl.device_type]
    if not outside:
        return (0, 0, 1)
    sizes = [_numel(local_block(shape, dst_pl, dst, r)) * itemsize for r in outside]
    return (kind_ticks(kind_of("send_recv"), hardware, None, 2, max(sizes)), sum(sizes), 1)


on_change(plan_move.cache_clear)
