"""The decompositions the ATen capture applies, so that every part has an exact SBP rule.

torch's own table decomposes losses, BatchNorm and GroupNorm into ATen ops. Means and variances are
written here in ATen (torch's versions go through ``prims``, whose ops carry no rules): a mean is a
sum over the global count, so a mean over a split dim is a partial sum that the divisor keeps
partial, exactly the global mean once reduced. That is what makes BatchNorm under data parallel
synchronised (SyncBatchNorm's statistics, equal to single-device torch) rather than per-shard.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _count(x: torch.Tensor, dims) -> int:
    dims = range(x.dim()) if dims is None or len(dims) == 0 else dims
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


def mean_dim(x, dim, keepdim=False, dtype=None):
    s = aten.sum.dim_IntList(x, dim, keepdim, dtype=dtype)
    return aten.div.Scalar(s, _count(x, dim))


def mean_default(x, dtype=None):
    return aten.div.Scalar(aten.sum.default(x, dtype=dtype), max(x.numel(), 1))


def var_mean_correction(x, dim=None, *, correction=None, keepdim=False):
    n = _count(x, dim)
    dims = list(range(x.dim())) if dim is None else dim
    mean = aten.div.Scalar(aten.sum.dim_IntList(x, dims, True), n)  # keepdim for the subtraction
    d = aten.sub.Tensor(x, mean)
    c = 1 if correction is None else correction
    var = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(d, d), dims, keepdim), max(n - c, 0))
    if not keepdim:
        mean = aten.squeeze.dims(mean, dims)
    return var, mean


def var_correction(x, dim=None, *, correction=None, keepdim=False):
    return var_mean_correction(x, dim, correction=correction, keepdim=keepdim)[0]


def decompositions() -> dict:
    from torch._decomp import get_decompositions

    table = get_decompositions([
        aten.nll_loss_forward, aten.nll_loss_backward, aten.nll_loss2d_forward, aten.nll_loss2d_backward,
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
        aten.native_batch_norm_backward, aten.native_group_norm, aten.native_group_norm_backward,
        aten.mse_loss, aten.mse_loss_backward,
    ])
    table.update({aten.mean.dim: mean_dim, aten.mean.default: mean_default,
                  aten.var_mean.correction: var_mean_correction, aten.var.correction: var_correction})
    return table
