"""``local_map`` for the ops DTensor has no rule for: the op runs on this rank's shards, with the
placements sbplab's signature gives it, inside an otherwise plain DTensor program.

Why: on CPU, ``F.scaled_dot_product_attention`` lowers to ``_scaled_dot_product_flash_attention_for_cpu``,
which has no DTensor sharding strategy, so every model with SDPA (GPT-2, Llama, BERT, ViT, Mixtral with
``attn_implementation="sdpa"``, nanoGPT) stops with ``NotImplementedError`` under DTensor. sbplab's rule
says attention splits over batch and heads; ``local_map`` states exactly that to DTensor.

The k-th call of the torch function in a forward is the k-th such op of the captured forward graph
(both follow the model's code in order), so each call gets the signature sbplab chose for it.
``LocalMapMode`` intercepts the calls (a ``TorchFunctionMode``); ``DTensorExport.running`` enters it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .placements import DTensorPlacement, placements_of

# ATen op (as captured) -> the torch function a model calls, whose call we wrap in local_map
TORCH_FUNCTIONS = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "scaled_dot_product_attention",
    "aten._scaled_dot_product_efficient_attention.default": "scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention.default": "scaled_dot_product_attention",
    "sbplab.scaled_dot_product_attention.default": "scaled_dot_product_attention",
}
SDPA_TENSOR_ARGS = ("query", "key", "value", "attn_mask")


@dataclass(frozen=True)
class LocalMapCall:
    """One call site: the torch function, where, and sbplab's placements for its tensors."""

    function: str
    module: str
    in_placements: tuple[tuple[DTensorPlacement, ...], ...]  # query, key, value[, attn_mask]
    out_placements: tuple[DTensorPlacement, ...]  # the attention output

    def describe(self) -> str:
        ins = ", ".join("[" + ", ".join(map(repr, p)) + "]" for p in self.in_placements)
        return (f"{self.module or 'the model'}: local_map(F.{self.function}, in_placements=({ins}), "
                f"out_placements=[{', '.join(map(repr, self.out_placements))}])")


def local_map_calls(step: Any) -> list[LocalMapCall]:
    """The call sites of a compiled step that DTensor cannot run by itself, in forward order."""
    d = step.deduction
    out = []
    for op in step.graph.ops_in("forward"):
        fn = TORCH_FUNCTIONS.get(op.type)
        if fn is None:
            continue
        sig = d.choices[op.name].signature
        out.append(LocalMapCall(fn, op.module or "", tuple(placements_of(nd) for nd in sig.inputs),
                                placements_of(sig.outputs[0])))
    return out


def _dense_grad(t: Any) -> Any:
    """``t`` (a view's output) with a gradient whose local tensor is laid out as its DTensor says. The
    gradient of a view of a replicated DTensor can come back through transposes with a local tensor strided
    unlike the stride DTensor records, and the view's backward then fails on it (Llama's
    ``k_proj(x).view(...)`` under tensor parallelism)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor) or not t.requires_grad:
        return t

    def dense(grad: Any) -> Any:
        if not isinstance(grad, DTensor) or grad._local_tensor.is_contiguous():
            return grad
        return DTensor.from_local(grad._local_tensor.contiguous(), grad.device_mesh, grad.placements,
                                  run_check=False, shape=grad.shape, stride=grad.stride())

    t.register_hook(dense)
    return t


def local_map_mode(calls: list[LocalMapCall]) -> Any:
    """A TorchFunctionMode that runs the k-th SDPA call on DTensors through local_map with ``calls[k]``."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.experimental import local_map
    from torch.overrides import TorchFunctionMode

    class LocalMapMode(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.k = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.view and isinstance(args[0], DTensor):
                return _dense_grad(func(*args, **kwargs))
            if func is not F.scaled_dot_product_attention or not any(isinstance(a, DTensor) for a in args[:3]):
                return func(*args, **kwargs)
            if self.k >= len(calls):
                raise RuntimeError(f"call {self.k + 1} of F.scaled_dot_product_attention in one forward; the "
                                   f"compiled step has {len(calls)} (re-enter DTensorExport.running per step)")
            call = calls[self.k]
            self.k += 1
            bound = dict(zip(SDPA_TENSOR_ARGS, args[:4]))
            bound.update((k, kwargs.pop(k)) for k in SDPA_TENSOR_ARGS if k in kwargs)
            more = args[4:]  # dropout_p, is_causal, ... given by position
            tensors = [bound[k] for k in SDPA_TENSOR_ARGS if bound.get(k) is not None]
            mesh = next(a for a in tensors if isinstance(a, DTensor)).device_mesh
            # a plain mask is the same on every rank: replicated, then laid out as sbplab's signature says
            tensors = [t if isinstance(t, DTensor) else DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim)
                       for t in tensors]
            in_pl = tuple(tuple(p.to_torch() for p in pl) for pl in call.in_placements[: len(tensors)])

            def local(q, k, v, mask=None):  # this rank's shards: (B/dp, H/tp, T, hs)
                return func(q, k, v, mask, *more, **kwargs)

            run = local_map(local, out_placements=[p.to_torch() for p in call.out_placements],
                            in_placements=in_pl, device_mesh=mesh, redistribute_inputs=True)
            return run(*tensors)

    return LocalMapMode()


__all__ = ["LocalMapCall", "local_map_calls", "local_map_mode"]
