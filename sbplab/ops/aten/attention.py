"""Scaled dot-product attention as one op, forward and backward, whatever kernel the device runs.

Why: captured plainly, ``F.scaled_dot_product_attention`` becomes the kernel torch picked on the
capturing machine (``_scaled_dot_product_flash_attention_for_cpu`` on a laptop), so a plan compiled
on a CPU would ask a GPU worker for a CPU kernel. Capture instead routes each call through
``sbplab.scaled_dot_product_attention`` (an ordinary library custom op, with its backward
``sbplab.scaled_dot_product_attention_backward`` registered as its autograd), and the dispatcher
picks the kernel by the device of the shards it runs on: flash-for-CPU on CPU; on CUDA flash
attention (fp16/bf16, no mask) or memory-efficient attention (any mask). Both carry the row
log-sum-exp ``lse`` (B, H, L) from forward to backward, so no backend recomputes the scores.

Calls the op does not cover run as torch decomposes them (dropout inside attention, a mask that
needs a gradient, value head size unlike the query's, nested tensors). Grouped-query attention (fewer
key/value heads) repeats key/value heads inside the kernel and sums their gradients back.
FLOPs are torch.utils.flop_counter's own SDPA formulas.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import flop_counter

aten = torch.ops.aten
FORWARD = "sbplab.scaled_dot_product_attention.default"
BACKWARD = "sbplab.scaled_dot_product_attention_backward.default"


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _float_mask(mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """A boolean mask (True = attend) as the additive mask the fused kernels take, in the query's dtype
    (a float32 mask meets bf16 queries under autocast)."""
    if mask is None or mask.dtype == q.dtype:
        return mask
    if mask.dtype != torch.bool:
        return mask.to(q.dtype)
    return torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))


def _groups(q: torch.Tensor, k: torch.Tensor) -> int:
    return q.shape[1] // k.shape[1]


def _repeat(k: torch.Tensor, v: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def _unrepeat(g: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of ``repeat_interleave(groups, dim=1)``: each key/value head sums its copies."""
    if groups == 1:
        return g
    b, h, s, e = g.shape
    return g.reshape(b, h // groups, groups, s, e).sum(2)


def _use_flash_cuda(q: torch.Tensor, mask: torch.Tensor | None) -> bool:
    return mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256


# (B, H, L, E) q, (B, Hkv, S, E) k, v, mask broadcastable to (B, H, L, S) -> (B, H, L, E) out, (B, H, L) lse
@torch.library.custom_op("sbplab::scaled_dot_product_attention", mutates_args=())
def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                                 is_causal: bool, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on CPU: the flash-for-CPU kernel (what torch picks there for these calls)."""
    k, v = _repeat(k, v, _groups(q, k))
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=_float_mask(mask, q),
                                                                scale=_scale(q, scale))
    return out, lse.float()


@scaled_dot_product_attention.register_kernel("cuda")
def _forward_cuda(q, k, v, mask, is_causal, scale):
    k, v = _repeat(k, v, _groups(q, k))
    if _use_flash_cuda(q, mask):
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=_scale(q, scale))[:2]
        return out, lse.float()
    out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, _float_mask(mask, q), True, 0.0, is_causal,
                                                            scale=_scale(q, scale))[:2]
    return out, lse[..., : q.shape[2]].float().contiguous()  # CUDA pads rows to a multiple of 32 (ROCm does not)


@scaled_dot_product_attention.register_fake
def _forward_fake(q, k, v, mask, is_causal, scale):
    b, h, length, _ = q.shape
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty((b, h, length), dtype=torch.float32)


@torch.library.custom_op("sbplab::scaled_dot_product_attention_backward", mutates_args=())
def scaled_dot_product_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                          mask: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor,
                                          is_causal: bool, scale: float | None
                                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward on CPU: flash-for-CPU's backward from the forward's output and lse."""
    groups = _groups(q, k)
    kr, vr = _repeat(k, v, groups)
    gq, gk, gv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, kr, vr, out, lse, 0.0, is_causal, attn_mask=_float_mask(mask, q), scale=_scale(q, scale))
    return gq, _unrepeat(gk, groups), _unrepeat(gv, groups)


@scaled_dot_product_attention_backward.register_kernel("cuda")
def _backward_cuda(grad, q, k, v, mask, out, lse, is_causal, scale):
    groups = _groups(q, k)
    kr, vr = _repeat(k, v, groups)
    no_rng = torch.empty((), dtype=torch.int64, device=q.device)  # dropout 0: the kernels draw nothing
    if _use_flash_cuda(q, mask):
        gq, gk, gv = aten._scaled_dot_product_flash_attention_backward(
            grad, q, kr, vr, out, lse, None, None, q.shape[2], kr.shape[2], 0.0, is_causal, no_rng, no_rng,
            scale=_scale(q, scale))
    else:
        pad = 0 if torch.version.hip else (-lse.shape[-1]) % 32  # CUDA's kernel keeps rows padded to 32
        lse_padded = F.pad(lse, (0, pad)) if pad else lse
        gq, gk, gv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad, q, kr, vr, _float_mask(mask, q), out, lse_padded, no_rng, no_rng, 0.0, [True, True, True, False],
            is_causal, scale=_scale(q, scale))
    return gq, _unrepeat(gk, groups), _unrepeat(gv, groups)


@scaled_dot_product_attention_backward.register_fake
def _backward_fake(grad, q, k, v, mask, out, lse, is_causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, mask, *output)
    ctx.is_causal, ctx.scale = is_causal, scale


def _backward(ctx, grad, _grad_lse):
    q, k, v, mask, out, lse = ctx.saved_tensors
    gq, gk, gv = scaled_dot_product_attention_backward(grad.contiguous(), q, k, v, mask, out, lse, ctx.is_causal,
                                                       ctx.scale)
    return gq, gk, gv, None, None, None


scaled_dot_product_attention.register_autograd(_backward, setup_context=_setup_context)


@flop_counter.register_flop_formula(torch.ops.sbplab.scaled_dot_product_attention)
def _forward_flops(q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(q_shape, _heads(k_shape, q_shape), _heads(v_shape, q_shape))


@flop_counter.register_flop_formula(torch.ops.sbplab.scaled_dot_product_attention_backward)
def _backward_flops(grad_shape, q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_shape, q_shape, _heads(k_shape, q_shape), _heads(v_shape, q_shape))


def _heads(shape, q_shape) -> tuple:
    """Key/value shape with the query's head count (grouped-query attention computes every head)."""
    return (shape[0], q_shape[1], *shape[2:])


def _covered(q, k, v, mask, dropout_p: float, enable_gqa: bool) -> bool:
    """Whether this call is one the op computes exactly as torch does."""
    tensors = [q, k, v] + ([mask] if mask is not None else [])
    if not all(isinstance(t, torch.Tensor) and not t.is_nested and type(t).__name__ != "DTensor" for t in tensors):
        return False  # DTensors (their export maps attention by itself), nested tensors: torch's own dispatch
    if dropout_p != 0.0 or q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or not q.is_floating_point():
        return False
    if mask is not None and (mask.requires_grad or mask.dim() > 4):
        return False
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]) or k.shape[1] != v.shape[1]:
        return False
    if k.shape[1] != q.shape[1] and not (enable_gqa and q.shape[1] % k.shape[1] == 0):
        return False
    return True


class AttentionMode(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` calls the op covers to ``sbplab.scaled_dot_product_attention``
    (entered around capture)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
            bound = {**dict(zip(names, args)), **kwargs}
            q, k, v = bound["query"], bound["key"], bound["value"]
            mask, is_causal = bound.get("attn_mask"), bool(bound.get("is_causal", False))
            if mask is not None and is_causal:
                return func(*args, **kwargs)  # torch's own error
            if _covered(q, k, v, mask, float(bound.get("dropout_p", 0.0)), bool(bound.get("enable_gqa", False))):
                return torch.ops.sbplab.scaled_dot_product_attention(q, k, v, mask, is_causal, bound.get("scale"))[0]
        return func(*args, **kwargs)
