"""The one rule that picks an op's signature, for the eager API and for the compiler alike.

Candidates are the op's valid n-D signatures (``nd_signatures``, all-B first). Each is priced by the
boxing its inputs need, from the SBP they have now to the SBP the signature reads, as the boxing
planner plans it, and ranked by

    (estimated boxing time, bytes sent, boxing steps, per-rank FLOPs of the op, listing order)

Why this rule and not bytes first (what the compiler used before): time is what the boxing planner
itself minimises when it picks a route, and what the search's cost model and the simulator add up,
so a signature choice and the route under it optimise the same thing. Bytes alone price a slow link
(InfiniBand between nodes) like a fast one (NVLink inside a node) and ignore per-step latency and
local work (a zero fill writes memory, a slice does not). Bytes then break ties between equally
fast plans, steps prefer fewer moves, and FLOPs prefer the signature that splits the work.

"Inputs keep their SBP where a signature accepts them" (OneFlow's rule) is not a special case: such
a signature needs no boxing, so its time, bytes and steps are all zero, and every other signature
needs at least one step (a local slice costs no time and no bytes, but is a step). It wins on the
ranking itself; among several free ones the one that does the least work per rank wins.

The caller supplies what it knows: ``input_cost`` prices bringing input i to an SBP (eager plans it
directly; the compiler through its caches, across pipeline stages too). The compiler also knows what
happens downstream (an output that must end in a store hint's SBP, or in the layout of the state it
replaces); it passes that as the optional ``extra`` term, added to the same cost. Eager has no such
knowledge and passes none. Nothing else differs, so a lone op with no downstream demand picks the
same signature eagerly and compiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..placement import Placement
from ..sbp import NdSbp
from .registry import (
    FORGETTERS,
    NdSignature,
    OpDef,
    TensorMeta,
    _zero_flops,
    get_op,
    local_context,
    nd_signatures,
    shape_key,
)

TIME_RESOLUTION_S = 1e-12  # times closer than this are a tie (float sums in another order differ by ulps)


@dataclass(frozen=True)
class BoxingCost:
    """What some boxing costs: estimated time, bytes sent (all ranks together) and steps; costs add."""

    time_s: float = 0.0
    bytes: int = 0
    steps: int = 0

    @staticmethod
    def of(plan: Any) -> BoxingCost:
        """The cost of a ``BoxingPlan``."""
        return BoxingCost(float(plan.time_s), int(plan.total_bytes), len(plan.steps))

    def __add__(self, other: BoxingCost) -> BoxingCost:
        return BoxingCost(self.time_s + other.time_s, self.bytes + other.bytes, self.steps + other.steps)


FREE = BoxingCost()


@dataclass(frozen=True)
class RankedSignature:
    """A signature that was considered, with the cost of the boxing it would need."""

    signature: NdSignature
    boxing_bytes: int  # bytes sent, inputs plus the caller's extra term
    boxing_time_s: float  # estimated seconds of that boxing
    boxing_steps: int  # boxing steps (local slices and zero fills count)
    local_flops: int  # FLOPs of the op on one rank's shards under this signature
    inputs_changed: int = 0  # inputs that need any boxing
    index: int = 0  # position in the op's signature list (all-B first): the last tie-break
    extra: BoxingCost = FREE  # the part of the cost the caller's extra term added (compiler: outputs)

    def cost_key(self) -> tuple:
        """The ranking key: smaller is better (see the module docstring for why this order)."""
        return (round(self.boxing_time_s / TIME_RESOLUTION_S), self.boxing_bytes, self.boxing_steps,
                self.local_flops, self.index)

    @property
    def keeps_inputs(self) -> bool:
        """True when every input is read exactly as it is (no boxing of any input)."""
        return self.inputs_changed == 0


def local_flops(op: OpDef, in_metas: Sequence[TensorMeta], attrs: dict, sig: NdSignature,
                placement: Placement) -> int:
    """FLOPs of ``op`` on one rank's shards under ``sig`` (the first rank; splits are balanced)."""
    if op.flops is _zero_flops:  # an op that never counts any: no shard to work out
        return 0
    return _local_flops(op.name, tuple(in_metas), shape_key(attrs), sig, placement)  # dropouts share


@lru_cache(maxsize=65536)
def _local_flops(name: str, in_metas: tuple[TensorMeta, ...], frozen: tuple, sig: NdSignature,
                 placement: Placement) -> int:
    op = get_op(name)
    attrs = {k: v for k, v in frozen}
    ctx = local_context(op, in_metas, attrs, sig, placement, placement.rank_list[0])
    if ctx is None:
        raise ValueError(f"{name}: signature {sig} leaves rank {placement.rank_list[0]} an empty shard")
    local = [TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ctx.in_blocks, in_metas)]
    local_attrs = op.localize(dict(attrs), ctx)
    return int(op.flops(local, op.infer(local, local_attrs), local_attrs))


FORGETTERS.append(_local_flops.cache_clear)


def rank_signatures(op: OpDef | str, in_metas: Sequence[TensorMeta], attrs: dict, placement: Placement,
                    have: Sequence[NdSbp], input_cost: Callable[[int, NdSbp], BoxingCost], *,
                    allowed: Callable[[NdSignature], bool] | None = None,
                    extra: Callable[[NdSignature], BoxingCost] | None = None) -> list[RankedSignature]:
    """Every valid signature of ``op`` that ``allowed`` lets through, cheapest first.

    ``have`` is each input's SBP now; ``input_cost(i, sbp)`` the cost of bringing input i to ``sbp``
    (asked once per pair; ``FREE`` where nothing moves, though an input on another placement costs
    its move even at the same SBP); ``extra(sig)`` an optional term the caller knows and eager does not (outputs that must end in a
    given SBP). An empty list means ``allowed`` let nothing through; the caller says why.
    """
    op = get_op(op) if isinstance(op, str) else op
    if len(have) != len(in_metas):
        raise ValueError(f"{op.name}: {len(in_metas)} inputs but {len(have)} input SBPs")
    memo: dict[tuple[int, NdSbp], BoxingCost] = {}

    def cost_of(i: int, want: NdSbp) -> BoxingCost:
        if (i, want) not in memo:
            memo[(i, want)] = input_cost(i, want)
        return memo[(i, want)]

    out = []
    counts = op.flops is not _zero_flops  # as local_flops decides, its key made once for every signature
    metas, frozen = (tuple(in_metas), shape_key(attrs)) if counts else ((), ())
    for k, sig in enumerate(nd_signatures(op, in_metas, attrs, placement)):
        if allowed is not None and not allowed(sig):
            continue
        total, changed = FREE, 0
        for i, want in enumerate(sig.inputs):
            c = cost_of(i, want)
            if c.steps or want != have[i]:
                changed += 1
            total = total + c
        more = extra(sig) if extra is not None else FREE
        total = total + more
        flops = _local_flops(op.name, metas, frozen, sig, placement) if counts else 0
        out.append(RankedSignature(sig, total.bytes, total.time_s, total.steps, flops, changed, k, more))
    out.sort(key=RankedSignature.cost_key)
    return out
