"""Run an op under a signature on simulated ranks and compare with the op on whole tensors.

This is how every signature in the library is checked: cut the inputs into the shards the
signature promises, run each rank's kernel, put the outputs together with the output SBPs, and
compare with plain PyTorch. Partial inputs are cut into random addends (or random candidates for
P(max)/P(min)) so that a wrong rule cannot pass by luck on zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..layout import assemble, check_layout, partial_fill, shard, split_range
from ..placement import Placement
from ..sbp import Broadcast, NdSbp, Partial, Split, fmt_sbp
from .registry import NdSignature, OpDef, TensorMeta, get_op, nd_signatures, run_local


def random_shards(full: torch.Tensor, placement: Placement, nd_sbp: NdSbp,
                  gen: torch.Generator | None = None, what: str = "tensor") -> dict[int, torch.Tensor]:
    """Shards of ``full`` whose assembly is ``full``, with random addends and candidates.

    Built in the nested order of n-D SBP (mesh axis 0 first): each piece is split, copied (one
    draw below it, so broadcast copies stay identical), cut into random addends (P), or into
    candidates whose max/min is the piece (each element's value held by a random rank, the
    others smaller/larger). Without ``gen`` this is ``layout.shard``: rank 0 holds P values.
    """
    check_layout(full.shape, placement, nd_sbp, what)
    if gen is None:
        return shard(full, placement, nd_sbp, what)

    def build(piece: torch.Tensor, axis: int) -> dict[tuple[int, ...], torch.Tensor]:
        if axis == placement.ndim:
            return {(): piece}
        n, x = placement.shape[axis], nd_sbp[axis]
        if isinstance(x, Broadcast):
            parts = [build(piece, axis + 1)] * n
        else:
            parts = [build(child, axis + 1) for child in _children(piece, x, n, gen)]
        return {(i, *k): v for i, sub in enumerate(parts) for k, v in sub.items()}

    by_coord = build(full, 0)
    return {r: by_coord[placement.coords(r)].clone() for r in placement.rank_list}


def _children(piece: torch.Tensor, x: Split | Partial, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    if isinstance(x, Split):
        return [piece.narrow(x.dim, s, e - s)
                for s, e in (split_range(piece.shape[x.dim], n, i) for i in range(n))]
    if not piece.dtype.is_floating_point:  # integer partials: the value on one rank, identities elsewhere
        return [piece] + [partial_fill(x.op, piece)] * (n - 1)
    if x.op == "sum":
        addends = [torch.randn(piece.shape, generator=gen, dtype=piece.dtype) for _ in range(n - 1)]
        return [piece - sum(addends, torch.zeros_like(piece))] + addends
    owner = torch.randint(0, n, piece.shape, generator=gen)
    out = []
    for i in range(n):
        gap = torch.rand(piece.shape, generator=gen, dtype=piece.dtype) + 0.1
        out.append(torch.where(owner == i, piece, piece - gap if x.op == "max" else piece + gap))
    return out


def run_signature(op: OpDef | str, inputs: Sequence[torch.Tensor], attrs: dict, placement: Placement,
                  sig: NdSignature, gen: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """Shard ``inputs`` as ``sig`` says, run every rank, assemble the outputs as ``sig`` says."""
    op = get_op(op) if isinstance(op, str) else op
    metas = [TensorMeta.of(t) for t in inputs]
    shards = [random_shards(t, placement, nd, gen, f"{op.name} input {i}")
              for i, (t, nd) in enumerate(zip(inputs, sig.inputs))]
    outs: list[dict[int, torch.Tensor]] = [{} for _ in sig.outputs]
    for rank in placement.rank_list:
        local = run_local(op, [s[rank] for s in shards], attrs, metas, sig, placement, rank)
        for j, t in enumerate(local):
            outs[j][rank] = t
    return tuple(assemble(o, placement, nd) for o, nd in zip(outs, sig.outputs))


def check_signature_numerics(op: OpDef | str, inputs: Sequence[torch.Tensor], attrs: dict,
                             placement: Placement, sigs: Sequence[NdSignature] | None = None,
                             gen: torch.Generator | None = None,
                             reference: Callable[..., torch.Tensor | Sequence[torch.Tensor]] | None = None,
                             rtol: float = 1e-4, atol: float = 1e-4) -> int:
    """Check that ``op`` gives the single-device result under every signature in ``sigs``.

    ``sigs`` defaults to every valid n-D signature on ``placement``; ``reference(*inputs)`` to the
    op's kernel on whole tensors. Raises AssertionError naming the op, signature and output on the
    first mismatch; returns how many signatures were checked.
    """
    op = get_op(op) if isinstance(op, str) else op
    metas = [TensorMeta.of(t) for t in inputs]
    if sigs is None:
        sigs = nd_signatures(op, metas, attrs, placement)
    want = reference(*inputs) if reference is not None else op.kernel(list(inputs), dict(attrs))
    want = (want,) if isinstance(want, torch.Tensor) else tuple(want)
    for s in sigs:
        got = run_signature(op, inputs, attrs, placement, s, gen)
        for j, (g, w) in enumerate(zip(got, want)):
            where = (f"{op.name} {attrs} on mesh {placement.shape}, signature {s}, output {j} "
                     f"({fmt_sbp(s.outputs[j])}), input shapes {[m.shape for m in metas]}")
            if g.shape != w.shape:
                raise AssertionError(f"{where}: shape {tuple(g.shape)} != {tuple(w.shape)}")
            if not torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
                err = (g - w).abs().max().item()
                raise AssertionError(f"{where}: values differ (max abs error {err:.3g})")
    return len(sigs)
