"""Small helpers to declare the compiler's own ops (gradients, optimizer updates) in the registry.

The compiler's ops use the same ``OpDef`` as the op library; these helpers only spell the common
signature families once: elementwise ops that keep any split, and ops linear in one input, which
may therefore take that input as a partial sum ``P`` when the other inputs are broadcast.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..sbp import B, P, S
from ._util import numel  # noqa: F401  (re-exported for the compiler's op files)
from .registry import REGISTRY, OpDef, Signature, TensorMeta, register


def define(op: OpDef) -> OpDef:
    """Register ``op`` unless an op of that name exists already (importing twice is harmless)."""
    if op.name in REGISTRY:
        return REGISTRY[op.name]
    return register(op)


def same_split(n_in: int, n_out: int, dims: Iterable[int], b_inputs: Sequence[int] = ()) -> list[Signature]:
    """S(d) on every input and output for each ``d`` in ``dims``; inputs in ``b_inputs`` stay B."""
    out = []
    for d in dims:
        ins = tuple(B if i in b_inputs else S(d) for i in range(n_in))
        out.append(Signature(ins, tuple(S(d) for _ in range(n_out))))
    return out


def linear_in(n_in: int, n_out: int, which: int) -> Signature:
    """P on input ``which`` and B on the rest gives P outputs: the op is linear in that input."""
    return Signature(tuple(P if i == which else B for i in range(n_in)), tuple(P for _ in range(n_out)))



def ew_flops(per_element: int):
    """FLOPs of an elementwise op: ``per_element`` operations per output element."""
    def flops(ins: Sequence[TensorMeta], outs: Sequence[TensorMeta], attrs: dict) -> int:
        return per_element * sum(m.numel for m in outs)
    return flops


def meta_like(m: TensorMeta, shape: Sequence[int] | None = None) -> TensorMeta:
    return TensorMeta(tuple(int(s) for s in (m.shape if shape is None else shape)), m.dtype)


def check_arity(name: str, ins: Sequence[TensorMeta], n: int) -> None:
    if len(ins) != n:
        raise ValueError(f"{name} takes {n} inputs, got {len(ins)}")


def check_same_shape(name: str, a: TensorMeta, b: TensorMeta, what: str = "inputs") -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name}: {what} must have the same shape, got {a.shape} and {b.shape}")


def block_shape(block) -> tuple[int, ...]:
    return tuple(e - s for s, e in block)
