"""Eager dispatch: pick an op's signature with the shared chooser, box the inputs, run every shard.

The choice is ``sbplab.ops.choose.rank_signatures``, the same rule the compiler's deduction uses:
inputs keep their SBP where a signature accepts them (that signature costs nothing), otherwise the
signature whose input boxing takes the least estimated time wins (then bytes, steps, per-rank FLOPs).
Eager knows nothing downstream of the op, so it passes no extra term. The user can force a signature
or an output SBP. Decisions are cached per (op, shapes, attrs, SBPs, placement), so a repeated op
costs a dictionary lookup plus its kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..boxing import BoxingPlan, plan_boxing
from ..boxing.route import BoxingError
from ..errors import InputTypeError
from ..hardware import Hardware
from ..layout import LayoutError
from ..ops.choose import BoxingCost, RankedSignature, rank_signatures
from ..ops.registry import NdSignature, TensorMeta, _freeze, get_op, local_context, nd_signatures
from ..ops.signature_text import SignatureError, as_raw, to_nd_signature, valid_text
from ..placement import Placement
from ..sbp import NdSbp, as_nd_sbp, fmt_sbp


@dataclass
class Decision:
    """Everything dispatch decided for one (op, inputs) situation; cached and reused."""

    signature: NdSignature
    candidates: list[RankedSignature]  # cheapest first; [0] is the chosen one
    input_plans: list[BoxingPlan]  # per input (an empty plan where it is read as it is)
    out_metas: list[TensorMeta]
    local_attrs: dict[int, dict]  # rank -> attrs for that shard
    forced: str  # "", "signature" or "output sbp"


_DEFAULT_HARDWARE: list[Hardware] = []


def default_hardware() -> Hardware:
    if not _DEFAULT_HARDWARE:
        _DEFAULT_HARDWARE.append(Hardware.cpu_box())
    return _DEFAULT_HARDWARE[0]


def set_default_hardware(hardware: Hardware) -> None:
    """The hardware model used to cost eager boxing (``sl.Hardware.h100_node()`` etc.)."""
    if not isinstance(hardware, Hardware):
        raise InputTypeError(f"set_default_hardware needs an sl.Hardware (e.g. sl.Hardware.cpu_box()), got "
                             f"{type(hardware).__name__}")
    _DEFAULT_HARDWARE[:] = [hardware]
    _CACHE.clear()


def _wanted_signature(text: str | NdSignature, in_metas: Sequence[TensorMeta], out_metas: Sequence[TensorMeta],
                      placement: Placement, op: str, valid: list[NdSignature]) -> NdSignature:
    """The signature the user forced, normalised; a SignatureError naming the valid ones otherwise."""
    raw = as_raw(text, op)  # bad text is a SignatureError, a wrong type a TypeError
    try:
        want = to_nd_signature(raw, [len(m.shape) for m in in_metas], [len(m.shape) for m in out_metas],
                               placement.ndim)
    except ValueError as e:
        raise SignatureError(op, f"{op}: signature {text!r} does not fit its tensors on a {placement.ndim}-D "
                                 f"mesh: {e}. Valid signatures: {valid_text(valid)}") from None
    if want not in valid:
        raise SignatureError(
            op, f"{op}: signature {want} is not valid for inputs "
                f"{', '.join(f'{tuple(m.shape)}' for m in in_metas)} on a mesh of shape {placement.shape}. "
                f"Valid signatures: {valid_text(valid)}")
    return want


def decide(op_name: str, in_metas: Sequence[TensorMeta], in_sbps: Sequence[NdSbp], attrs: dict,
           placement: Placement, signature: str | NdSignature | None = None,
           out_sbp: NdSbp | None = None, hardware: Hardware | None = None, display: str | None = None) -> Decision:
    """Choose the signature for one op call (cached); errors name the op as ``display`` (the eager
    method, "matmul", rather than the ATen op it runs, "aten.mm.default")."""
    hardware = hardware or default_hardware()
    key = (op_name, tuple(in_metas), tuple(in_sbps), _freeze(attrs), placement, str(signature),
           out_sbp, id(hardware), display)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    op = get_op(op_name)
    valid = nd_signatures(op, in_metas, attrs, placement)
    out_metas = list(op.infer(in_metas, attrs))
    plans: dict[tuple[int, NdSbp], BoxingPlan] = {}

    def plan(i: int, want: NdSbp) -> BoxingPlan:
        if (i, want) not in plans:
            plans[(i, want)] = plan_boxing(in_metas[i].shape, in_sbps[i], want, placement,
                                           dtype=in_metas[i].dtype, hardware=hardware)
        return plans[(i, want)]

    def routable(sig: NdSignature) -> bool:
        """Whether every input can be boxed to what ``sig`` reads (a strided split is made only by ops)."""
        try:
            for i, w in enumerate(sig.inputs):
                plan(i, w)
        except (BoxingError, LayoutError):
            return False
        return True

    def rank(allowed=None) -> list[RankedSignature]:
        return rank_signatures(op, in_metas, attrs, placement, in_sbps,
                               lambda i, want: BoxingCost.of(plan(i, want)),
                               allowed=lambda s: routable(s) and (allowed is None or allowed(s)))

    forced = ""
    if signature is not None:
        want = _wanted_signature(signature, in_metas, out_metas, placement, display or op_name, valid)
        best = rank(lambda s: s == want)[0]
        others = [c for c in rank() if c.signature != want]  # still show what the free choice would cost
        forced = "signature"
    else:
        if out_sbp is not None:
            forced = "output sbp"
            ranked = rank(lambda s: s.outputs[0] == out_sbp)
            if not ranked:
                outs = sorted({fmt_sbp(s.outputs[0]) for s in valid})
                raise SignatureError(
                    display or op_name, f"{display or op_name}: no signature produces output SBP {fmt_sbp(out_sbp)}; "
                             f"possible output SBPs: {', '.join(outs)} (or convert afterwards with .to_global)")
        else:
            ranked = rank()
        best, others = ranked[0], ranked[1:]
    sig = best.signature
    local_attrs = {}
    for r in placement.rank_list:
        ctx = local_context(op, in_metas, attrs, sig, placement, r)
        local_attrs[r] = op.localize(dict(attrs), ctx)
    dec = Decision(sig, [best, *others], [plan(i, w) for i, w in enumerate(sig.inputs)], out_metas,
                   local_attrs, forced)
    _CACHE[key] = dec
    return dec


_CACHE: dict[tuple, Decision] = {}


def normalise_out_sbp(out_sbp, placement: Placement, ndim: int, op: str) -> NdSbp | None:
    if out_sbp is None:
        return None
    return as_nd_sbp(out_sbp, placement.ndim, ndim, what=f"output of {op}")
