"""One accelerator as a cost model sees it: peaks per dtype, memory, and how much of the peaks real kernels get.

A spec-sheet roofline (``max(flops / peak, bytes / bandwidth)``) is 1.5-1.7x optimistic for a transformer
step: no kernel reaches the tensor-core peak, small matrix multiplies reach far less, and memory-bound
kernels stream at most ~85-90% of HBM bandwidth. ``DeviceModel.kernel_seconds`` keeps the roofline's
shape but with achievable figures:

- matrix multiplies (``linear``, ``matmul``, ``mm``, ``bmm``, ``addmm``, their gradients, convolutions) run
  at ``gemm_ceiling * F / (F + gemm_half_flops)`` of the dtype's peak, F the kernel's FLOPs: efficiency
  rises with size toward the ceiling large cuBLAS GEMMs reach;
- fused attention kernels (``scaled_dot_product``, flash / efficient attention) at ``attention_ceiling``;
- view ops (view, reshape, transpose, expand...) launch no kernel: free;
- other kernels (elementwise, norms, reductions) compute on the vector units at the fp32 peak;
- every kernel moves its bytes at ``mem_efficiency`` of HBM bandwidth, and takes at least
  ``kernel_floor`` (launch and tail of a short kernel).

The figures of the presets, with their sources, are in ``machine_presets.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .errors import InputError

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
GEMM = re.compile(r"(^|[._:])(linear|matmul|mm|bmm|addmm|baddbmm|addbmm|conv\w*|einsum)(_grad\w*)?($|[._])")
# ops that only change a tensor's view (shape, strides, offset): no kernel on a GPU (a copy they need is its
# own op, a clone or contiguous, in a captured graph)
VIEW = re.compile(r"(^|[.:])(view|_unsafe_view|reshape|transpose|t|expand|permute|squeeze|unsqueeze|alias|detach|"
                  r"as_strided|slice|select|split|split_with_sizes|unbind|unflatten|flatten|narrow|view_as)"
                  r"($|[.])")
ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention")


class MachineError(InputError):
    """A Machine (or a machine file) that cannot describe a cluster: the field, the value, what is valid."""


def dtype_name(dtype: torch.dtype | str | None) -> str:
    """"fp32", "bf16", "fp16", "tf32" from a torch dtype or one of those names (None: fp32)."""
    if dtype is None:
        return "fp32"
    if isinstance(dtype, str):
        d = dtype.replace("torch.", "")
        return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}.get(d, d)
    return DTYPE_NAMES.get(dtype, "fp32")


def kernel_class(op: str) -> str:
    """"gemm", "attention", "view" (no kernel) or "other" (memory-bound) for an op or kernel name."""
    if VIEW.search(op):
        return "view"
    if ATTENTION.search(op):
        return "attention"
    if GEMM.search(op.lower()):
        return "gemm"
    return "other"


@dataclass(frozen=True)
class DeviceModel:
    """Peaks, capacity and achievable efficiency of one device.

    peaks: dense FLOP/s per dtype name ("fp32", "tf32", "bf16", "fp16"), as the datasheet gives them.
    mem_bandwidth: bytes/s of device memory (datasheet).
    memory: bytes of device memory a program can use.
    gemm_ceiling: fraction of the peak the largest GEMMs sustain (cuBLAS).
    gemm_half_flops: FLOPs of a GEMM that reaches half the ceiling (smaller GEMMs are less efficient).
    attention_ceiling: fraction of the peak a fused attention kernel sustains.
    mem_efficiency: fraction of ``mem_bandwidth`` a streaming kernel sustains.
    kernel_floor: seconds even the shortest kernel takes (launch, tail).
    """

    name: str
    peaks: tuple[tuple[str, float], ...]
    mem_bandwidth: float
    memory: int
    gemm_ceiling: float = 1.0
    gemm_half_flops: float = 0.0
    attention_ceiling: float = 1.0
    mem_efficiency: float = 1.0
    kernel_floor: float = 0.0

    def __post_init__(self) -> None:
        peaks = tuple((str(k), float(v)) for k, v in (self.peaks.items() if isinstance(self.peaks, dict)
                                                       else self.peaks))
        object.__setattr__(self, "peaks", peaks)
        if "fp32" not in dict(peaks):
            raise MachineError(f"DeviceModel {self.name!r}: peaks needs an 'fp32' entry (FLOP/s), got "
                             f"{sorted(dict(peaks))}")
        for k, v in peaks:
            if not v > 0:
                raise MachineError(f"DeviceModel {self.name!r}: peaks[{k!r}] must be a positive FLOP/s, got {v!r}")
        for f in ("mem_bandwidth", "memory"):
            if not getattr(self, f) > 0:
                raise MachineError(f"DeviceModel {self.name!r}: {f} must be positive, got {getattr(self, f)!r}")
        for f in ("gemm_ceiling", "attention_ceiling", "mem_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise MachineError(f"DeviceModel {self.name!r}: {f} is a fraction of the peak, in (0, 1], got {v!r}")
        for f in ("gemm_half_flops", "kernel_floor"):
            if not getattr(self, f) >= 0:
                raise MachineError(f"DeviceModel {self.name!r}: {f} must be >= 0, got {getattr(self, f)!r}")

    def peak(self, dtype: torch.dtype | str | None) -> float:
        """Dense FLOP/s at ``dtype`` (fp16 falls back to bf16, anything unknown to fp32)."""
        p = dict(self.peaks)
        name = dtype_name(dtype)
        if name == "fp16" and name not in p:
            name = "bf16"
        return p.get(name, p["fp32"])

    def gemm_efficiency(self, flops: float) -> float:
        """Fraction of the peak a GEMM of ``flops`` FLOPs sustains."""
        if self.gemm_half_flops <= 0:
            return self.gemm_ceiling
        return self.gemm_ceiling * flops / (flops + self.gemm_half_flops)

    def kernel_seconds(self, op: str, flops: float, nbytes: float, dtype: torch.dtype | str | None) -> float:
        """Seconds of one kernel of ``op`` doing ``flops`` FLOPs and moving ``nbytes`` bytes at ``dtype``."""
        cls = kernel_class(op)
        if cls == "view":
            return 0.0
        peak = self.peak(dtype)
        if cls == "gemm" and flops > 0:
            compute = flops / (peak * self.gemm_efficiency(flops))
        elif cls == "attention" and flops > 0:
            compute = flops / (peak * self.attention_ceiling)
        else:  # elementwise, reductions, norms: vector units, not tensor cores
            compute = flops / dict(self.peaks)["fp32"]
        memory = nbytes / (self.mem_bandwidth * self.mem_efficiency)
        return max(compute, memory, self.kernel_floor if (flops or nbytes) else 0.0)
