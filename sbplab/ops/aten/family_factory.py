"""Factory ops (arange, full, zeros, ones, empty, new_*): made locally in the layout asked for, so a
split output costs nothing; ``arange`` shifts its range to the rank's piece."""

from __future__ import annotations

from ..registry import LocalContext, Signature, TensorMeta
from ._common import B, P, S, arg, sig


def factory_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """The output split any way; a ``new_*`` op reads only its input's dtype and device, so that input
    may come split or partial for a whole (B) output, and split like the output when it has its shape."""
    out = outs[0].shape
    sigs = [sig([B] * len(ins), [S(d)]) for d in range(len(out)) if out[d] > 1]
    if len(ins) == 1:
        x = ins[0].shape
        sigs += [sig([S(d)], [B]) for d in range(len(x)) if x[d] > 1] + [sig([P], [B])]
        sigs += [sig([S(d)], [S(d)]) for d in range(len(x)) if x == out and x[d] > 1]
    return sigs


def arange_localize(name: str):
    """arange(end) / arange(start, end) / arange(start, end, step) on rank's rows [s, e)."""
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        (s, e), = ctx.out_blocks[0]
        if name == "aten.arange.default":
            start, step = 0, 1
        else:
            start = arg(attrs, 0, "start")
            step = arg(attrs, 2, "step", 1) if name == "aten.arange.start_step" else 1
        kwargs = tuple((k, v) for k, v in attrs.get("kwargs", ()) if k not in ("start", "end", "step"))
        return {"op": "aten.arange.start_step", "args": (start + s * step, start + e * step, step),
                "kwargs": kwargs}
    return localize
