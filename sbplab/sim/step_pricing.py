"""What the simulator prices beyond the actor plan: the step's precision and recomputation, and the work it
counts for throughput (tokens, samples, model FLOPs).

Precision and recomputation are strategy options the compiler carries out in the graph (autocast casts,
recomputed ops cloned into the backward). Where a graph already carries them, its ops are priced as
they are. Where it does not (a capture that kept fp32, a graph compiled before recomputation), the
simulator prices what the strategy asks for anyway, so a what-if on a model that cannot yet be
compiled that way still answers:

- compute precision: forward and backward kernels whose tensors are fp32 run at the compute dtype's
  peak and move its bytes (``compute_dtype``); updates stay in the master dtype;
- ``recompute="full"``: the forward of every repeated layer (module path ``blocks.3...``) runs again in
  the backward; ``"selective"``: only the attention cores (the ops on (B, H, T, T) scores, or a fused
  attention op). Their seconds are added to the rank's backward kernels (spread over them in
  proportion), which is where the recomputation runs.

Model FLOPs are the captured graph's forward and backward FLOPs (global shapes, per step, all ranks),
the quantity that 6 * parameters * tokens approximates (it counts attention's score FLOPs too); the
FLOPs of recomputation are apart (``recompute_flops``): Megatron-LM (Narayanan et al., SC21, eq. 3)
reports throughput with them included, PaLM's MFU without.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from ..compiler.deduction.precision import DTYPES
from ..ops.registry import REGISTRY, TensorMeta

RECOMPUTE_SUFFIX = ".recompute"  # the compiler's name for a recomputed op (compiler/training/recompute.py)
_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")  # "blocks.0.attn.q" -> "blocks.0": one of a model's repeated layers
_FUSED_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention")


@dataclass(frozen=True)
class StepPricing:
    """compute_dtype: price fp32 forward/backward kernels at this dtype (None: as the graph says).
    recomputed: (rank, actor name) of forward actors whose work the backward repeats (the graph does not).
    samples, tokens: per step (0: unknown; tokens need an integer (batch, sequence) input).
    model_flops: forward and backward FLOPs of one step over all ranks, recomputation excluded.
    recompute_flops: FLOPs recomputation adds per step (the graph's clones or the priced repeat).
    compute: the compute dtype of the step (the peak MFU is measured against)."""

    compute_dtype: torch.dtype | None = None
    recomputed: frozenset = frozenset()
    samples: int = 0
    tokens: int = 0
    model_flops: float = 0.0
    recompute_flops: float = 0.0
    compute: torch.dtype = torch.float32


def _op_flops(g: Any, op: Any) -> float:
    opdef = REGISTRY.get(op.type)
    if opdef is None:
        return 0.0
    ins = [g.tensors[t].meta for t in op.inputs if t in g.tensors]
    outs = [g.tensors[t].meta for t in op.outputs if t in g.tensors]
    try:
        return float(opdef.flops(ins, outs, op.attrs))
    except Exception:  # noqa: BLE001 - an op whose FLOPs rule cannot read these attrs counts none
        return 0.0


def _is_attention_core(g: Any, op: Any) -> bool:
    """An op on attention scores: a (..., T, T) input or output, T > 1, or a fused attention op."""
    if _FUSED_ATTENTION.search(op.type):
        return True
    if "linear" in op.type:
        return False
    for t in (*op.inputs, *op.outputs):
        m: TensorMeta | None = getattr(g.tensors.get(t), "meta", None)
        if m is not None and len(m.shape) >= 3 and m.shape[-1] == m.shape[-2] > 1:
            return True
    return False


def _tokens_and_samples(g: Any, M: int) -> tuple[int, int]:
    for name in g.inputs:
        m = g.tensors[name].meta
        if len(m.shape) >= 2 and not m.dtype.is_floating_point and not m.dtype.is_complex:
            return int(m.shape[0]) * int(m.shape[1]) * M, int(m.shape[0]) * M
    for name in g.inputs:
        m = g.tensors[name].meta
        if m.shape:
            return 0, int(m.shape[0]) * M
    return 0, 0


def _compute_precision(strategy: Any) -> torch.dtype:
    return DTYPES.get(getattr(getattr(strategy, "precision", None), "compute", "fp32"), torch.float32)


def compute_dtype_of(g: Any, strategy: Any) -> torch.dtype | None:
    """The dtype fp32 kernels of ``g`` are priced at: the strategy's compute precision where the graph was
    traced without it (its forward outputs all fp32), else None (priced as traced)."""
    compute = _compute_precision(strategy)
    if compute == torch.float32:
        return None
    traced_low = any(g.tensors[t].meta.dtype in (torch.bfloat16, torch.float16)
                     for op in g.ops_in("forward") for t in op.outputs if t in g.tensors)
    return None if traced_low else compute


def pricing_of(step: Any, whole_layers: bool = False) -> StepPricing | None:
    """The pricing of a Compiled step (None for a bare ActorPlan: priced as its actors say).
    ``whole_layers``: ``recompute="full"`` reruns every forward op of a layer, also those the graph's
    recomputation left out because the backward does not read them (``Framework.recompute_whole_layer``)."""
    g, phys, strategy = getattr(step, "graph", None), getattr(step, "physical", None), getattr(step, "strategy", None)
    if g is None or phys is None:
        return None
    M = max(int(getattr(g, "micro_batches", 1) or 1), int(getattr(phys, "micro_batches", 1) or 1))
    fwd = g.ops_in("forward")
    compute = _compute_precision(strategy)
    compute_dtype = compute_dtype_of(g, strategy)
    clones = [op for op in g.ops_in("backward") if op.name.endswith(RECOMPUTE_SUFFIX)]
    model = sum(_op_flops(g, op) for op in (*fwd, *g.ops_in("backward")) if not op.name.endswith(RECOMPUTE_SUFFIX))
    mode = getattr(strategy, "recompute", "none")
    redo: set[str] = set()
    re_flops = sum(_op_flops(g, op) for op in clones)
    if mode != "none" and not clones:
        for op in fwd:
            if (mode == "full" and _LAYER.match(op.module or "")) or (mode == "selective" and _is_attention_core(g, op)):
                redo.add(op.name)
        re_flops = sum(_op_flops(g, op) for op in fwd if op.name in redo)
    elif mode == "full" and whole_layers:  # the layer ops the graph did not clone run again too
        cloned = {op.name[:-len(RECOMPUTE_SUFFIX)] for op in clones}
        redo = {op.name for op in fwd if _LAYER.match(op.module or "") and op.name not in cloned}
        re_flops += sum(_op_flops(g, op) for op in fwd if op.name in redo)
    recomputed = frozenset((n.rank, f"n{n.id}") for n in phys.nodes
                           if n.kind == "compute" and n.phase == "forward" and n.logical in redo) if redo else frozenset()
    tokens, samples = _tokens_and_samples(g, M)
    return StepPricing(compute_dtype=compute_dtype, recomputed=recomputed, samples=samples, tokens=tokens,
                       model_flops=model * M, recompute_flops=re_flops * M, compute=compute)
