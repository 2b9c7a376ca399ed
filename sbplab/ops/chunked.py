"""Which signatures also hold for strided splits (``S(d, chunks=k)``): the lift the registry applies.

An op that treats the positions of a dim alike (a pointwise op, a matmul's rows, columns or contracted
dim, a transpose, a view that keeps the dim whole, a sum over it, an optimizer's update) computes on any
subset of that dim's indices what it computes on a contiguous slice, so each of its split signatures
holds as well with every split entry strided, provided all the entries split dims of one size (the same
positions on every tensor). Ops that read positions (a slice or split along the dim, an embedding's rows,
an arange) are not lifted; the split of a fused tensor into its chunks has its own rule
(``family_shape.split_signatures``).

Only 3 chunks are lifted (a fused QKV layer): every lifted chunk count adds signatures to every op
whose split dims it divides.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..sbp import Split
from .registry import Signature, TensorMeta

CHUNKS = (3,)
ATEN_FAMILIES = ("pointwise", "matmul", "shape", "reduction", "along-dim")
NATIVE = ("sgd_update", "sgd_momentum_update", "adam_update", "acc", "cast", "scale")


def liftable(name: str) -> bool:
    if name in NATIVE:
        return True
    if not name.startswith("aten."):
        return False
    from .aten.rules import rule_for

    return rule_for(name).family in ATEN_FAMILIES


def lift(name: str, sigs: Sequence[Signature], ins: Sequence[TensorMeta], outs: Sequence[TensorMeta]
         ) -> list[Signature]:
    """``sigs`` and, for a liftable op, each split signature with its splits strided (see the docstring)."""
    out = list(sigs)
    if not sigs or not liftable(name):
        return out
    for sig in sigs:
        pairs = [(x, m) for x, m in (*zip(sig.inputs, ins), *zip(sig.outputs, outs)) if isinstance(x, Split)]
        if not pairs or any(x.chunks != 1 or not -len(m.shape) <= x.dim < len(m.shape) for x, m in pairs):
            continue
        sizes = {m.shape[x.dim] for x, m in pairs}
        if len(sizes) != 1:
            continue
        n = sizes.pop()
        for k in CHUNKS:
            if n % k == 0 and n // k > 1:
                out.append(Signature(tuple(_chunk(x, k) for x in sig.inputs), tuple(_chunk(x, k) for x in sig.outputs)))
    return out


def _chunk(x, k: int):
    return Split(x.dim, k) if isinstance(x, Split) else x
