"""Signatures as people write them, and the one error for a signature that cannot be had.

The eager API (``sl.apply(..., signature=...)``) and the compiler's signature hints accept the same
text, written the way ``NdSignature`` prints::

    "S(0), B -> S(0)"                          # 1-D mesh: one SBP per input, then per output
    "(S(0)), (B) -> (S(0))"                    # the same, as NdSignature's repr writes it
    "(S(0), B), (B, S(1)) -> (S(0), S(1))"     # 2-D mesh: one n-D SBP per tensor, in parentheses

Parsing gives a raw signature (split dims as written); ``to_nd_signature`` normalises it against the
tensors' ranks and the mesh. Both layers raise ``SignatureError``, one class, so ``sl.SignatureError``
and ``sbplab.compiler.SignatureError`` catch the same thing; it is a ``HintError`` (a forced
signature is a hint), so that class lives here too and the compiler's strategy module imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputTypeError, SbplabError
from ..sbp import NdSbp, as_nd_sbp, parse_sbp
from .registry import NdSignature, Signature

RawSignature = tuple[tuple[NdSbp, ...], tuple[NdSbp, ...]]  # as written: split dims not yet normalised
EXAMPLE = "write inputs -> outputs, like 'S(0), B -> S(0)' on a 1-D mesh or '(S(0), B), (B, S(1)) -> (S(0), S(1))'"


class HintError(SbplabError, ValueError):
    """Hints that cannot all hold: the message names the tensor and both demands.

    Defined here, below the compiler, because a forced signature is a hint too, eager or compiled:
    ``SignatureError`` is one, and ``sbplab.compiler.HintError`` is this class.
    """


class SignatureError(HintError):
    """No signature of an op gives what was asked for (a forced signature, an output SBP, a hint).

    ``op`` names the op (or the hint's pattern, or "" where the text alone is wrong) it is about.
    """

    def __init__(self, op: str, message: str) -> None:
        super().__init__(message)
        self.op = op


def _split_top(text: str, whole: str, fail) -> list[str]:
    """``text`` cut at the commas outside parentheses."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise fail("a ')' closes nothing")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise fail("a '(' is never closed")
    items.append(text[start:])
    if len(items) == 1 and not items[0].strip():
        return []  # no tensors on this side
    return items


def _side(text: str, whole: str, fail) -> tuple[NdSbp, ...]:
    out = []
    for item in _split_top(text, whole, fail):
        s = item.strip()
        if not s:
            raise fail("an empty entry between commas")
        inner = s[1:-1] if s.startswith("(") and s.endswith(")") else s
        try:
            out.append(parse_sbp(inner))
        except ValueError as e:
            raise fail(str(e)) from None
    return tuple(out)


def parse_signature(text: str, op: str = "") -> RawSignature:
    """``"(S(0), B), (B, S(1)) -> (S(0), S(1))"`` -> (inputs, outputs), each a tuple of n-D SBPs.

    A tensor's SBP is one entry (``S(0)``, 1-D meshes) or entries in parentheses (``(S(0), B)``);
    the ``repr`` of any ``NdSignature`` parses back to it. ``op`` only names the op in errors.
    """
    if not isinstance(text, str):
        raise InputTypeError(f"a signature is a string or an NdSignature, got {type(text).__name__}")

    def fail(why: str) -> SignatureError:
        return SignatureError(op, f"{op + ': ' if op else ''}cannot parse signature {text!r}: {why}; {EXAMPLE}")

    if text.count("->") != 1:
        raise fail("it needs exactly one '->'")
    left, right = text.split("->")
    ins, outs = _side(left, text, fail), _side(right, text, fail)
    if not outs:
        raise fail("no outputs after '->'")
    return ins, outs


def as_raw(sig: object, op: str = "") -> RawSignature:
    """Text, an ``NdSignature`` or (1-D meshes) a ``Signature`` as a raw signature."""
    if isinstance(sig, str):
        return parse_signature(sig, op)
    if isinstance(sig, NdSignature):
        return tuple(sig.inputs), tuple(sig.outputs)
    if isinstance(sig, Signature):  # a 1-D signature, for 1-D meshes
        return tuple((x,) for x in sig.inputs), tuple((x,) for x in sig.outputs)
    raise InputTypeError(f"a signature is a string like 'S(0), B -> S(0)' or an NdSignature, got {type(sig).__name__}")


def to_nd_signature(raw: RawSignature, in_ranks: Sequence[int], out_ranks: Sequence[int], mesh_ndim: int,
                    in_names: Sequence[str] | None = None, out_names: Sequence[str] | None = None) -> NdSignature:
    """``raw`` with split dims normalised against each tensor's rank; ValueError where it cannot fit
    (wrong number of tensors, of mesh axes, or a split dim the tensor does not have)."""
    ins, outs = raw
    if len(ins) != len(in_ranks) or len(outs) != len(out_ranks):
        raise ValueError(f"it names {len(ins)} input(s) and {len(outs)} output(s), the op has "
                         f"{len(in_ranks)} and {len(out_ranks)}")
    in_names = in_names or [""] * len(ins)
    out_names = out_names or [""] * len(outs)
    return NdSignature(
        tuple(as_nd_sbp(x, mesh_ndim, r, f"input {i}" + (f" ({n})" if n else ""))
              for i, (x, r, n) in enumerate(zip(ins, in_ranks, in_names))),
        tuple(as_nd_sbp(x, mesh_ndim, r, f"output {j}" + (f" ({n})" if n else ""))
              for j, (x, r, n) in enumerate(zip(outs, out_ranks, out_names))))


def valid_text(cands: Sequence[NdSignature], limit: int = 12) -> str:
    """The first ``limit`` signatures, for error messages that list what would have been valid."""
    return "; ".join(map(repr, cands[:limit])) + (f"; ... ({len(cands)} in all)" if len(cands) > limit else "")
