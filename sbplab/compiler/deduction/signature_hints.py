"""Signature hints: a strategy may say which n-D signature an op must take.

Tensor hints say how a tensor is kept; some decisions are about an op instead ("this GELU runs on
the hidden-split layout", the choice a person makes by clicking an op's signature). A signature
hint names ops by glob over their names and the signature they take, written the way
``NdSignature`` prints and parsed by ``sbplab.ops.signature_text`` (the parser eager uses too)::

    "S(0), B -> S(0)"                          # 1-D mesh: one SBP per input, then per output
    "(S(0), B), (B, S(1)) -> (S(0), S(1))"     # 2-D mesh: one n-D SBP per tensor, in parentheses

Deduction takes the signature (boxing the inputs to fit, exactly as for a deduced choice) and says
so in the explanation; a signature the op does not have on its mesh is an error that names the op,
the signature asked for and the valid ones.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from ...ops.registry import NdSignature, nd_signatures
from ...ops.signature_text import (  # noqa: F401  (the one parser and error, shared with eager)
    EXAMPLE,
    RawSignature,
    SignatureError,
    as_raw,
    parse_signature,
    to_nd_signature,
    valid_text,
)
from ..ir import Graph, GraphError, OpNode


@dataclass(frozen=True)
class SignatureHint:
    """Ops whose names match ``pattern`` (a glob) take ``signature``; ``why`` says who asked."""

    pattern: str
    signature: object  # str, NdSignature or (1-D meshes) Signature
    why: str = ""
    raw: RawSignature = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern.strip():
            raise ValueError(f"a signature hint needs an op name or glob pattern, got {self.pattern!r}")
        object.__setattr__(self, "raw", as_raw(self.signature))  # bad syntax fails where it is written

    @property
    def text(self) -> str:
        return self.signature if isinstance(self.signature, str) else repr(self.signature)

    def describe(self) -> str:
        return f"signature hint {self.pattern!r}" + (f" [{self.why}]" if self.why else "")


def signatures_of(graph: Graph, op: OpNode) -> list[NdSignature]:
    """Every valid n-D signature of ``op`` on its placement (all-B first), as deduction sees them."""
    if op.placement is None:
        raise GraphError(f"op {op.name!r} has no placement yet; assign placements (deduce) first")
    metas = [graph.tensors[i].meta for i in op.inputs]
    try:
        return nd_signatures(op.type, metas, op.attrs, op.placement)
    except (ValueError, TypeError) as e:
        raise GraphError(f"op {op.name!r} ({op.type}): cannot list its signatures: {e}") from e


def _no_such(op: OpNode, h: SignatureHint, cands: list[NdSignature], detail: str) -> SignatureError:
    return SignatureError(op.name, f"op {op.name!r} ({op.type}) has no signature {h.text!r} on a mesh of shape "
                                   f"{op.placement.shape} ({h.describe()}): {detail}; valid: {valid_text(cands)}")


def resolve_one(graph: Graph, op: OpNode, h: SignatureHint) -> NdSignature:
    """``h``'s signature for ``op``, split dims normalised; an error unless the op has it on its mesh."""
    cands = signatures_of(graph, op)
    try:
        sig = to_nd_signature(h.raw, [len(graph.tensors[t].shape) for t in op.inputs],
                              [len(graph.tensors[t].shape) for t in op.outputs], op.placement.ndim,
                              op.inputs, op.outputs)
    except (ValueError, TypeError) as e:
        raise _no_such(op, h, cands, str(e)) from None
    if sig not in cands:
        raise _no_such(op, h, cands, f"{sig} is not a valid layout for these shapes")
    return sig


def forced_signatures(graph: Graph, hints: list[SignatureHint]) -> dict[str, tuple[NdSignature, SignatureHint]]:
    """Per op: the signature it must take and the hint that says so. Ops need placements (for their mesh).

    A hint that matches no op is an error (a forced signature that silently does nothing hides typos),
    and so are two hints giving one op different signatures.
    """
    out: dict[str, tuple[NdSignature, SignatureHint]] = {}
    for h in hints:
        exact = not any(c in h.pattern for c in "*?[")  # a plain name (a search's hints): one lookup
        ops = ([graph.op_by_name[h.pattern]] if h.pattern in graph.op_by_name else []) if exact else \
            [op for op in graph.ops if fnmatch.fnmatchcase(op.name, h.pattern)]
        if not ops:
            some = ", ".join(op.name for op in graph.ops if op.phase == "forward")
            raise SignatureError(h.pattern, f"{h.describe()} ({h.text!r}) matches no op; forward ops are: "
                                            f"{some[:300]}{' ...' if len(some) > 300 else ''}")
        for op in ops:
            sig = resolve_one(graph, op, h)
            if op.name in out and out[op.name][0] != sig:
                old, old_h = out[op.name]
                raise SignatureError(op.name, f"op {op.name!r} is given two signatures: {old} by {old_h.describe()} "
                                              f"and {sig} by {h.describe()}; drop one or make the patterns disjoint")
            out.setdefault(op.name, (sig, h))
    return out


def escape(name: str) -> str:
    """A glob that matches exactly the op called ``name`` (brackets around ``*``, ``?`` and ``[``)."""
    if "*" not in name and "?" not in name and "[" not in name:  # most names: the name itself
        return name
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
