"""Run an op under a signature on simulated ranks and compare with the op on whole tensors.

This is how every signature in the library is checked: cut the inputs into the shards the
signature promises, run each rank's kernel, put the outputs together with the output SBPs, and
compare with plain PyTorch. Partial inputs are cut into random addends (or random candidates for
P(max)/P(min)) so that a wrong rule cannot pass by luck on zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..layout import assemble, check_layout, shard
from ..layout import random_shards as layout_random_shards
from ..placement import Placement
from ..sbp import NdSbp, fmt_sbp
from .registry import NdSignature, OpDef, TensorMeta, get_op, nd_signatures, run_local


def random_shards(full: torch.Tensor, placement: Placement, nd_sbp: NdSbp,
                  gen: torch.Generator | None = None, what: str = "tensor") -> dict[int, torch.Tensor]:
    """Shards of ``full`` whose assembly is ``full``: ``layout.shard`` without ``gen``, else random
    addends and candidates (``layout.random_shards``)."""
    check_layout(full.shape, placement, nd_sbp, what)
    if gen is None:
        return shard(full, placement, nd_sbp, what)
    return layout_random_shards(full, placement, nd_sbp, gen)


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
