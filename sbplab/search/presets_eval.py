"""The presets that apply to a device count, and their choices read off a deduction, so they are
priced by the same cost model as every searched candidate (and can seed coordinate descent)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..compiler.deduction import presets
from ..compiler.deduction.deduce import deduce
from ..compiler.deduction.strategy import Strategy
from ..compiler.ir import Graph
from ..hardware import Hardware
from ..ops.registry import NdSignature


@dataclass
class PresetSpec:
    name: str
    make: Callable[[], Strategy]
    zero: int
    n_stages: int = 1
    micro_batches: int = 1


@dataclass
class PresetChoice:
    """What deduction gave a preset's forward ops: a signature and a stage each."""

    spec: PresetSpec
    strategy: Strategy
    signatures: dict[str, NdSignature]
    stage_of_op: dict[str, int]
    mesh_shape: tuple[int, ...]


def applicable_presets(devices: int, batch: int, pipelines: bool = True) -> list[PresetSpec]:
    """The presets the search prices beside its own strategies. Tensor parallel keeps the vocabulary whole
    (``vocab=False``): the search prices the graph it captured, with torch's own cross entropy, and a
    preset that wins compiles (``sl.compile``) to that same graph, so it simulates as predicted."""
    out = [PresetSpec(f"data parallel x{devices}", lambda: presets.data_parallel(devices), 0)]
    if devices > 1:
        out += [PresetSpec(f"Megatron tensor parallel x{devices}",
                           lambda: presets.tensor_parallel(devices, vocab=False), 0),
                PresetSpec(f"ZeRO-2 x{devices}", lambda: presets.zero(devices, shard_params=False), 2),
                PresetSpec(f"ZeRO-3 x{devices}", lambda: presets.zero(devices, shard_params=True), 3)]
    for a in range(2, devices):
        if devices % a == 0 and devices // a > 1:
            out.append(PresetSpec(f"DP x TP {a}x{devices // a}", lambda a=a: presets.dp_tp((a, devices // a), vocab=False), 0))
    if pipelines:
        for s in (2, 4):
            m = 2 * s
            if devices % s == 0 and batch % m == 0:
                k = devices // s
                out.append(PresetSpec(f"pipeline {s} stages x {m} micro-batches" + (f", dp x{k} inside" if k > 1 else ""),
                                      lambda s=s, k=k, m=m: presets.pipeline(s, m, k, inner="dp" if k > 1 else "none"),
                                      0, s, m))
    return out


def preset_choice(graph: Graph, spec: PresetSpec, hw: Hardware | None) -> PresetChoice:
    """Deduce ``spec``'s forward ops on a copy of ``graph`` (the training graph at its micro-batch size)."""
    st = spec.make()
    g = graph.copy()
    d = deduce(g, st, hw, forward_only=True)
    fwd = g.ops_in("forward")
    return PresetChoice(spec, st, {op.name: d.choices[op.name].signature for op in fwd},
                        {op.name: op.stage for op in fwd}, fwd[0].placement.shape)
