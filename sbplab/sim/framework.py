"""What another training framework does beyond a step's graph, to predict a run of that framework.

Why: the simulator predicts sbplab's own runtime, which overlaps gradient reductions with the backward,
recomputes only the forward ops the backward reads, and runs the update the graph holds. Checking it
against a published run (``benchmarks/bench_published.py``: Megatron-LM, Narayanan et al., SC21) needs
what that framework did differently; a ``Framework`` names each difference, with its source, and the
simulator prices it (``simulate(..., framework=)``):

- ``recompute_whole_layer``: full recomputation reruns every forward op of the layer in the backward
  (``torch.utils.checkpoint`` and Megatron's ``CheckpointFunction`` call the layer's forward again),
  not only those whose outputs the backward reads (sbplab's recompute pass drops the rest: a layer's last
  projection, its dropouts);
- ``grad_reduce_after_backward``: the data-parallel gradient reduction starts once the backward of the
  last micro-batch is done, with nothing to overlap (the simulated overlap is added to the step as a
  serial tail; the timeline still draws the overlapped schedule);
- ``optimizer_bytes_per_param``: memory traffic per parameter the optimizer step moves beyond the
  graph's update (a mixed-precision optimizer's grad-norm, its master-to-model copy, its buffer
  zeroing), charged at the device's achievable memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Framework:
    """How a framework's step differs from the graph sbplab runs (see the module docstring).

    name: what is predicted, as printed.
    recompute_whole_layer: full recomputation reruns the whole layer forward.
    grad_reduce_after_backward: gradient reductions run after the backward, not overlapped with it.
    optimizer_bytes_per_param: extra bytes per parameter the optimizer step reads and writes.
    """

    name: str
    recompute_whole_layer: bool = False
    grad_reduce_after_backward: bool = False
    optimizer_bytes_per_param: float = 0.0


SBPLAB = Framework("sbplab")

# Megatron-LM as the SC21 paper ran it (v2.x, 2021: local DDP, Float16OptimizerWithFloat16Params, bf16):
# - megatron/mpu/random.py CheckpointFunction.backward runs ``ctx.run_function(*detached_inputs)``: the
#   whole layer forward again (with the RNG state replayed for its dropouts);
# - megatron/training.py train_step: forward_backward_func over all micro-batches, then
#   ``model.allreduce_gradients()`` (local DDP: one all-reduce of the contiguous fp32 main_grad buffer),
#   then ``optimizer.step()``: nothing overlaps the reduction;
# - per step, per parameter, beyond Adam's own reads and writes (the graph's update): ``zero_grad_buffer``
#   writes the fp32 main_grad (4 B); ``clip_grad_norm_fp32`` reads it for the norm (multi_tensor_l2norm,
#   4 B); ``_copy_main_params_to_model_params`` reads the fp32 master and writes the bf16 model copy
#   (4 + 2 B). bf16 has no loss scaling, so no unscale or inf check (fp16 would add 8 B).
MEGATRON_LM_2021 = Framework("Megatron-LM (2021)", recompute_whole_layer=True, grad_reduce_after_backward=True,
                             optimizer_bytes_per_param=4 + 4 + 4 + 2)


def overlapped_seconds(f, rank: int, chosen: set[int], lo: float, hi: float) -> float:
    """Seconds inside [lo, hi] during which a transfer of one of the ``chosen`` actors (indices on
    ``rank``) ran while ``rank``'s compute lane was busy: what a framework that does not overlap those
    transfers adds to the window."""
    from .engine import COMPUTE

    comp, xfer = [], []
    for j in range(len(f)):
        if f.rank[j] != rank:
            continue
        if f.lane[j] == COMPUTE:
            a, b = f.start[j], f.end[j]
            (comp if b > lo and a < hi else []).append((max(a, lo), min(b, hi)))
        elif f.node[j] in chosen and f.end[j] > lo and f.xfer[j] < hi:
            xfer.append((max(f.xfer[j], lo), min(f.end[j], hi)))
    merged: list[list[float]] = []
    for a, b in sorted(xfer):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    comp.sort()
    hidden, ci = 0.0, 0
    for a, b in merged:
        while ci < len(comp) and comp[ci][1] <= a:
            ci += 1
        cj = ci
        while cj < len(comp) and comp[cj][0] < b:
            hidden += max(0.0, min(comp[cj][1], b) - max(comp[cj][0], a))
            cj += 1
    return hidden
