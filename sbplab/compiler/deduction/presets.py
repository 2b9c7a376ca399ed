"""Ready-made strategies: data parallel, Megatron tensor parallel, DP x TP, ZeRO, pipelines.

Each preset is a composition of parallelism rules over mesh axes (``parallel/``): ``dp_tp((2, 2))`` is
``Strategy(mesh, [DataParallel(0), TensorParallel(1)])``. Rules are only hints once they meet the
graph; deduction fills in everything else, so a preset's effect can be read off the explanation of any
op. Megatron's column/row layers are nominated by module name (``fc1``/``fc2``, attention
``q``/``k``/``v``/``proj``, ``conv1``/``conv2`` by default; pass your own globs for other models, or none
of them matches and the graph's structure alone decides) and paired only where the graph allows it:
every op between them must keep the split without communication (``megatron.find_pairs``). A LayerNorm
or a residual add in between leaves both layers replicated; ``strategy.explain(model)`` says which layers
were paired and why the others were not. The presets' tensor-parallel rule warns
(``sl.TensorParallelWarning``) rather than fails when it splits nothing, since it meets every model.

Presets are device-free: their placements leave the device unbound, so one preset compiles for cpu or
cuda (``sl.compile(..., device=...)``, ``bind_device``) or runs on whatever cluster runs it. A
``Placement`` passed in keeps the device it was written with.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import InputError
from ...placement import Placement
from .parallel.data_parallel import DataParallel, ZeRO
from .parallel.pipeline_parallel import Pipeline
from .parallel.tensor_parallel import COLUMN, ROW, TensorParallel
from .strategy import Strategy

__all__ = ["COLUMN", "ROW", "as_mesh", "data_parallel", "dp_tp", "pipeline", "tensor_parallel", "zero"]


def as_mesh(mesh: Placement | int | Sequence[int], axis_names: tuple[str, ...] | None = None) -> Placement:
    """``4`` -> a 1-D mesh of 4 ranks; ``(2, 2)`` -> a 2x2 mesh, both device-free; placements pass through."""
    if isinstance(mesh, Placement):
        return mesh
    if isinstance(mesh, int) and not isinstance(mesh, bool):
        return Placement(None, mesh, axis_names)
    shape = tuple(mesh) if isinstance(mesh, (tuple, list)) else ()
    if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
        raise InputError(f"a mesh is a rank count (4), a mesh shape of ints >= 1 ((2, 2)) or an sl.Placement; "
                         f"got {mesh!r}")
    n = 1
    for s in shape:
        n *= s
    ranks: list = list(range(n))
    for s in reversed(shape[1:]):
        ranks = [ranks[i:i + s] for i in range(0, len(ranks), s)]
    return Placement(None, ranks, axis_names)


def _tp(axis: int, column: Sequence[str], row: Sequence[str], sequence_parallel: bool,
        vocab: bool | None) -> TensorParallel:
    return TensorParallel(axis, sequence_parallel, tuple(column), tuple(row), vocab=vocab, required=False)


def data_parallel(mesh: Placement | int, micro_batches: int = 1) -> Strategy:
    """Batch split on every rank, parameters replicated; gradients all-reduced by the optimizer's signature."""
    pl = as_mesh(mesh)
    # on an n-D mesh the batch is split over every axis: (S(0), S(0)) nests the splits
    return Strategy(pl, [DataParallel(None)], micro_batches=micro_batches, name=f"data parallel x{pl.size}")


def tensor_parallel(mesh: Placement | int, column: Sequence[str] = COLUMN, row: Sequence[str] = ROW,
                    micro_batches: int = 1, sequence_parallel: bool = False, vocab: bool | None = None) -> Strategy:
    """Megatron: column-parallel then row-parallel layers, one all-reduce per pair forward and backward.
    The embedding and the output layer are split over the vocabulary where that is right (``vocab=None``):
    where the loss runs on vocabulary shards (a captured model's cross entropy), so the logits are never
    gathered; ``vocab=True`` splits them everywhere (the logits gathered where the loss needs them whole),
    ``vocab=False`` never."""
    pl = as_mesh(mesh)
    if pl.ndim != 1:
        raise InputError(f"tensor_parallel needs a 1-D mesh, got shape {pl.shape}; for data parallel x tensor "
                         f"parallel on a 2-D mesh use presets.dp_tp({pl.shape})")
    return Strategy(pl, [_tp(0, column, row, sequence_parallel, vocab)], micro_batches=micro_batches,
                    name=f"Megatron tensor parallel x{pl.size}")


def dp_tp(mesh: Placement | Sequence[int], column: Sequence[str] = COLUMN, row: Sequence[str] = ROW,
          micro_batches: int = 1, sequence_parallel: bool = False, vocab: bool | None = None) -> Strategy:
    """2-D mesh (dp, tp): batch split on axis 0, Megatron on axis 1 (``vocab`` as in ``tensor_parallel``)."""
    pl = as_mesh(mesh, ("dp", "tp") if isinstance(mesh, (tuple, list)) and len(mesh) == 2 else None)
    if pl.ndim != 2:
        raise InputError(f"dp_tp needs a 2-D mesh (dp, tp) such as (2, 2) or a 2-D sl.Placement, got "
                         f"{mesh!r} (shape {pl.shape}); for one mesh axis use data_parallel or tensor_parallel")
    return Strategy(pl, [DataParallel(0), _tp(1, column, row, sequence_parallel, vocab)], micro_batches=micro_batches,
                    name=f"DP x TP {pl.shape[0]}x{pl.shape[1]}")


def zero(mesh: Placement | int, shard_params: bool = True, micro_batches: int = 1, level: int | None = None) -> Strategy:
    """ZeRO data parallel: gradients and optimizer state ``S(0)``; parameters stored ``S(0)`` and
    gathered for use (``shard_params``, level 3), or kept ``B`` and re-gathered after the update (level 2).
    ``level`` (1, 2 or 3), when given, says it in one word."""
    pl = as_mesh(mesh)
    if pl.ndim != 1:
        raise InputError(f"zero needs a 1-D mesh, got shape {pl.shape}")
    level = level if level is not None else 3 if shard_params else 2
    return Strategy(pl, [DataParallel(0), ZeRO(level, 0)], micro_batches=micro_batches, name=f"ZeRO-{level} x{pl.size}")


def pipeline(stages: int, micro_batches: int, ranks_per_stage: int | Sequence[int] = 1, inner: str = "none",
             stage_of: dict[str, int] | None = None, column: Sequence[str] = COLUMN,
             row: Sequence[str] = ROW, device_type: str | None = None, schedule: str = "1f1b") -> Strategy:
    """``stages`` pipeline stages on consecutive ranks, ``micro_batches`` per step.

    Inside each stage: ``inner`` = "none" (one rank), "dp", "tp", "zero" (a 1-D mesh of
    ``ranks_per_stage``) or "dp_tp" (a 2-D mesh, ``ranks_per_stage=(dp, tp)``). The stages are
    device-free unless ``device_type`` ("cpu", "cuda") binds them.
    """
    if not isinstance(stages, int) or stages < 1:
        raise InputError(f"pipeline needs stages >= 1, got {stages}")
    shape = (ranks_per_stage,) if isinstance(ranks_per_stage, int) else tuple(ranks_per_stage)
    if inner == "dp_tp" and len(shape) != 2:
        raise InputError("pipeline(inner='dp_tp') needs ranks_per_stage=(dp, tp)")
    if inner not in ("none", "dp", "tp", "zero", "dp_tp"):
        raise InputError(f"inner must be one of none, dp, tp, zero, dp_tp; got {inner!r}")
    full = as_mesh((stages, *shape)).bind(device_type)
    inside = {"none": [], "dp": [DataParallel(0)], "zero": [DataParallel(0), ZeRO(3, 0)],
              "tp": [_tp(0, column, row, False, False)], "dp_tp": [DataParallel(0), _tp(1, column, row, False, False)]}
    name = f"pipeline {stages} stages x {micro_batches} micro-batches" + (f", {inner} inside" if inner != "none" else "")
    return Strategy(full, [Pipeline(0, micro_batches, stages, schedule, dict(stage_of or {})), *inside[inner]],
                    name=name)
