"""The matmul family: rows, columns or the contracted dim split (Megatron's column, row and
data-parallel cases are all here), batch dims of bmm, and partial sums passed through either factor."""

from __future__ import annotations

from ..registry import Signature, TensorMeta
from ._common import B, P, S, sig


def mm_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    # (m, k) @ (k, n) -> (m, n)
    return [sig([S(0), B], [S(0)]), sig([B, S(1)], [S(1)]), sig([S(1), S(0)], [P]),
            sig([P, B], [P]), sig([B, P], [P])]


def bmm_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    # (b, m, k) @ (b, k, n) -> (b, m, n)
    return [sig([S(0), S(0)], [S(0)]), sig([S(1), B], [S(1)]), sig([B, S(2)], [S(2)]),
            sig([S(2), S(1)], [P]), sig([P, B], [P]), sig([B, P], [P])]


def batched_matmul_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """(*batch, m, k) @ (*batch, k, n) with the same batch dims (attention's (B, nh, T, hs) products, kept
    4-D by ``unmerge_batched_matmuls``): every batch dim passes a split, as bmm's batch dim does."""
    n = len(outs[0].shape)
    batch = [sig([S(d), S(d)], [S(d)]) for d in range(n - 2)]
    return batch + [sig([S(n - 2), B], [S(n - 2)]), sig([B, S(n - 1)], [S(n - 1)]),
                    sig([S(n - 1), S(n - 2)], [P]), sig([P, B], [P]), sig([B, P], [P])]


def addmm_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """bias + a @ b: the bias follows the output's split where it has that dim, else stays B; when the
    product is partial, the bias is too (B -> P is free: one rank keeps it, the others zeros)."""
    bias, out = ins[0].shape, outs[0].shape
    lead = len(out) - len(bias)

    def bias_split(d: int):
        k = d - lead
        return S(k) if k >= 0 and bias[k] == out[d] and bias[k] > 1 else B

    if len(ins) == 3 and len(out) == 2:  # addmm
        return [sig([bias_split(0), S(0), B], [S(0)]), sig([bias_split(1), B, S(1)], [S(1)]),
                sig([P, S(1), S(0)], [P]), sig([P, P, B], [P]), sig([P, B, P], [P])]
    return [sig([bias_split(0), S(0), S(0)], [S(0)]), sig([bias_split(1), S(1), B], [S(1)]),  # baddbmm
            sig([bias_split(2), B, S(2)], [S(2)]), sig([P, S(2), S(1)], [P]), sig([P, P, B], [P]),
            sig([P, B, P], [P])]
