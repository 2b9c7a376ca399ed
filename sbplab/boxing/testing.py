"""Shards with honest partial values, for checking collectives.

``layout.shard`` gives rank 0 the value and zeros elsewhere under ``P``, and copies under ``P(max)``;
a reduction that just took the first shard would pass on such input. ``random_shards`` instead draws
random addends (sum) or random candidates (max/min, each element won by a random rank), following
the nested meaning of an n-D SBP: mesh axis 0 first, copies identical along broadcast axes. Values
stay integer-valued, so sums are exact and results can be compared bit for bit.
"""

from __future__ import annotations

import torch

from ..layout import split_range
from ..placement import Placement
from ..sbp import Broadcast, NdSbp, Split


def random_shards(full: torch.Tensor, placement: Placement, nd_sbp: NdSbp,
                  generator: torch.Generator | None = None) -> dict[int, torch.Tensor]:
    """One shard per rank whose assembled value is exactly ``full`` (integer-valued floats advised)."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)

    def noise(like: torch.Tensor, low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high, like.shape, generator=g).to(like.dtype)

    def build(piece: torch.Tensor, axis: int) -> dict[tuple[int, ...], torch.Tensor]:
        if axis == placement.ndim:
            return {(): piece.clone()}
        p, x = placement.shape[axis], nd_sbp[axis]
        if isinstance(x, Broadcast):
            sub = build(piece, axis + 1)  # one draw, copied to every coordinate of the axis
            parts = [sub] * p
        elif isinstance(x, Split):
            parts = []
            for i in range(p):
                a, b = split_range(piece.shape[x.dim], p, i)
                parts.append(build(piece.narrow(x.dim, a, b - a), axis + 1))
        elif x.op == "sum":
            addends = [noise(piece, -4, 5) for _ in range(p - 1)]
            first = piece - sum(addends) if addends else piece
            parts = [build(t, axis + 1) for t in [first, *addends]]
        else:  # max/min: every candidate is beaten by (or equal to) the value, one random rank equals it
            winner = torch.randint(0, p, piece.shape, generator=g)
            sign = -1 if x.op == "max" else 1
            parts = [build(torch.where(winner == i, piece, piece + sign * noise(piece, 1, 4)), axis + 1)
                     for i in range(p)]
        return {(i, *k): v for i, sub in enumerate(parts) for k, v in sub.items()}

    by_coord = build(full, 0)
    return {r: by_coord[placement.coords(r)].clone() for r in placement.rank_list}
