"""sbplab's SBP in DTensor's words: ``S(i)`` is ``Shard(i)``, ``B`` is ``Replicate()``, ``P`` is
``Partial()`` (BRIEF section 7). Plain data here; ``to_torch`` builds the torch objects, importing
``torch.distributed`` only then, so describing an export never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sbp import Broadcast, Partial, SbpParallel, Split


@dataclass(frozen=True)
class DTensorPlacement:
    """One mesh axis of a DTensor placement: ``kind`` is shard, replicate or partial."""

    kind: str
    dim: int | None = None  # shard only: the tensor dim
    split_factor: int = 1  # shard only: S(dim, chunks=k) is DTensor's _StridedShard(dim, split_factor=k)
    reduce_op: str = "sum"  # partial only: sum, max or min

    def __post_init__(self) -> None:
        if self.kind not in ("shard", "replicate", "partial"):
            raise ValueError(f"DTensorPlacement.kind must be shard, replicate or partial, got {self.kind!r}")
        if (self.kind == "shard") != (self.dim is not None):
            raise ValueError(f"DTensorPlacement: a shard needs a dim and nothing else may have one, got {self}")

    @staticmethod
    def of(x: SbpParallel) -> DTensorPlacement:
        if isinstance(x, Split):
            return DTensorPlacement("shard", x.dim, split_factor=x.chunks)
        if isinstance(x, Broadcast):
            return DTensorPlacement("replicate")
        if isinstance(x, Partial):
            return DTensorPlacement("partial", reduce_op=x.op)
        raise TypeError(f"not an SBP: {x!r}")

    def __repr__(self) -> str:
        if self.kind == "shard":
            return f"Shard({self.dim})" if self.split_factor == 1 else f"_StridedShard({self.dim}, sf={self.split_factor})"
        if self.kind == "replicate":
            return "Replicate()"
        return "Partial()" if self.reduce_op == "sum" else f"Partial({self.reduce_op!r})"

    def to_torch(self):
        """The ``torch.distributed.tensor`` placement object."""
        from torch.distributed.tensor import Partial as TPartial
        from torch.distributed.tensor import Replicate, Shard

        if self.kind == "shard" and self.split_factor > 1:
            from torch.distributed.tensor.placement_types import _StridedShard

            return _StridedShard(self.dim, split_factor=self.split_factor)
        if self.kind == "shard":
            return Shard(self.dim)
        return Replicate() if self.kind == "replicate" else TPartial(self.reduce_op)


def placements_of(nd: tuple) -> tuple[DTensorPlacement, ...]:
    """An n-D SBP, one DTensor placement per mesh axis."""
    return tuple(DTensorPlacement.of(x) for x in nd)


def text(placements: tuple[DTensorPlacement, ...]) -> str:
    return "[" + ", ".join(map(repr, placements)) + "]"
