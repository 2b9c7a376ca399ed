"""Signature hints: a strategy may say which n-D signature an op must take.

Tensor hints say how a tensor is kept; some decisions are about an op instead ("this GELU runs on
the hidden-split layout", the choice a person makes by clicking an op's signature). A signature
hint names ops by glob over their names and the signature they take, written the way
``NdSignature`` prints::

    "S(0), B -> S(0)"                          # 1-D mesh: one SBP per input, then per output
    "(S(0)), (B) -> (S(0))"                    # the same, as NdSignature's repr writes it
    "(S(0), B), (B, S(1)) -> (S(0), S(1))"     # 2-D mesh: one n-D SBP per tensor, in parentheses

Deduction takes the signature (boxing the inputs to fit, exactly as for a deduced choice) and says
so in the explanation; a signature the op does not have on its mesh is an error that names the op,
the signature asked for and the valid ones.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from ..ops.registry import NdSignature, Signature, nd_signatures
from ..sbp import NdSbp, as_nd_sbp, parse_sbp
from .ir import Graph, GraphError, OpNode
from .strategy import HintError

RawSignature = tuple[tuple[NdSbp, ...], tuple[NdSbp, ...]]  # as written: split dims not yet normalised
EXAMPLE = "write inputs -> outputs, like 'S(0), B -> S(0)' on a 1-D mesh or '(S(0), B), (B, S(1)) -> (S(0), S(1))'"


class SignatureError(HintError):
    """A signature hint that cannot be obeyed; ``op`` is the op (or the pattern) it is about."""

    def __init__(self, op: str, message: str) -> None:
        super().__init__(message)
        self.op = op


def _split_top(text: str, whole: str) -> list[str]:
    """``text`` cut at the commas outside parentheses."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"cannot parse signature {whole!r}: a ')' closes nothing; {EXAMPLE}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"cannot parse signature {whole!r}: a '(' is never closed; {EXAMPLE}")
    items.append(text[start:])
    if len(items) == 1 and not items[0].strip():
        return []  # no tensors on this side
    return items


def _side(text: str, whole: str) -> tuple[NdSbp, ...]:
    out = []
    for item in _split_top(text, whole):
        s = item.strip()
        if not s:
            raise ValueError(f"cannot parse signature {whole!r}: an empty entry between commas; {EXAMPLE}")
        inner = s[1:-1] if s.startswith("(") and s.endswith(")") else s
        try:
            out.append(parse_sbp(inner))
        except ValueError as e:
            raise ValueError(f"cannot parse signature {whole!r}: {e}; {EXAMPLE}") from None
    return tuple(out)


def parse_signature(text: str) -> RawSignature:
    """``"(S(0), B), (B, S(1)) -> (S(0), S(1))"`` -> (inputs, outputs), each a tuple of n-D SBPs.

    A tensor's SBP is one entry (``S(0)``, 1-D meshes) or entries in parentheses (``(S(0), B)``);
    the ``repr`` of any ``NdSignature`` parses back to it.
    """
    if not isinstance(text, str):
        raise TypeError(f"a signature is a string or an NdSignature, got {type(text).__name__}")
    if text.count("->") != 1:
        raise ValueError(f"cannot parse signature {text!r}: it needs exactly one '->'; {EXAMPLE}")
    left, right = text.split("->")
    ins, outs = _side(left, text), _side(right, text)
    if not outs:
        raise ValueError(f"cannot parse signature {text!r}: no outputs after '->'; {EXAMPLE}")
    return ins, outs


def as_raw(sig: object) -> RawSignature:
    if isinstance(sig, str):
        return parse_signature(sig)
    if isinstance(sig, NdSignature):
        return tuple(sig.inputs), tuple(sig.outputs)
    if isinstance(sig, Signature):  # a 1-D signature, for 1-D meshes
        return tuple((x,) for x in sig.inputs), tuple((x,) for x in sig.outputs)
    raise TypeError(f"a signature is a string like 'S(0), B -> S(0)' or an NdSignature, got {type(sig).__name__}")


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


def valid_text(cands: list[NdSignature], limit: int = 12) -> str:
    return "; ".join(map(repr, cands[:limit])) + (f"; ... ({len(cands)} in all)" if len(cands) > limit else "")


def _no_such(op: OpNode, h: SignatureHint, cands: list[NdSignature], detail: str) -> SignatureError:
    return SignatureError(op.name, f"op {op.name!r} ({op.type}) has no signature {h.text!r} on a mesh of shape "
                                   f"{op.placement.shape} ({h.describe()}): {detail}; valid: {valid_text(cands)}")


def resolve_one(graph: Graph, op: OpNode, h: SignatureHint) -> NdSignature:
    """``h``'s signature for ``op``, split dims normalised; an error unless the op has it on its mesh."""
    cands = signatures_of(graph, op)
    ins, outs = h.raw
    if len(ins) != len(op.inputs) or len(outs) != len(op.outputs):
        raise _no_such(op, h, cands, f"it names {len(ins)} input(s) and {len(outs)} output(s), the op has "
                                     f"{len(op.inputs)} and {len(op.outputs)}")
    ndim = op.placement.ndim
    try:
        sig = NdSignature(
            tuple(as_nd_sbp(x, ndim, len(graph.tensors[t].shape), f"input {i} ({t})")
                  for i, (x, t) in enumerate(zip(ins, op.inputs))),
            tuple(as_nd_sbp(x, ndim, len(graph.tensors[t].shape), f"output {j} ({t})")
                  for j, (x, t) in enumerate(zip(outs, op.outputs))))
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
        ops = [op for op in graph.ops if fnmatch.fnmatchcase(op.name, h.pattern)]
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
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
