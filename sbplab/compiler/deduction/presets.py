"""Ready-made strategies: data parallel, Megatron tensor parallel, DP x TP, ZeRO, pipelines.

Each preset is only hints and placements; deduction fills in everything else, so a preset's
effect can be read off the explanation of any op. Megatron's column/row layers are nominated by
module name (``fc1``/``fc2``, attention ``q``/``k``/``v``/``proj``, ``conv1``/``conv2`` by
default; pass your own globs for other models) and paired only where the graph allows it: every
op between them must keep the split without communication (``megatron.find_pairs``). A LayerNorm or
a residual add in between leaves both layers replicated; ``strategy.explain(model)`` says which
layers were paired and why the others were not.

Presets are device-free: their placements leave the device unbound, so one preset compiles for cpu or
cuda (``sl.compile(..., device=...)``, ``bind_device``) or runs on whatever cluster runs it. A
``Placement`` passed in keeps the device it was written with.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import InputError
from ...placement import Placement
from ...sbp import B, S
from .megatron_rule import MegatronRule
from .strategy import Strategy

COLUMN = ("*fc1", "*.q", "*.k", "*.v", "*conv1")  # weight (out, in) split by output features
ROW = ("*fc2", "*.proj", "*conv2")  # weight split by input features; output is P


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


def _nd(axis: int, ndim: int, x) -> tuple:
    return tuple(x if a == axis else B for a in range(ndim))


def _dp_hints(st: Strategy, axis: int, ndim: int) -> None:
    st.hint("*", _nd(axis, ndim, S(0)), f"data parallel: batch split on mesh axis {axis}", role="input",
            required=False)


def _tp_hints(st: Strategy, axis: int, ndim: int, column: Sequence[str], row: Sequence[str],
              dp_axis: int | None = None) -> None:
    """Megatron on mesh axis ``axis``: a rule that, once the graph is known, splits the weights of real
    column/row pairs and pins one all-reduce per pair each way (g forward, f backward). Globs the user
    chose (not the defaults) must each name a layer."""
    strict = tuple(column) != COLUMN or tuple(row) != ROW
    st.megatron.append(MegatronRule(axis, ndim, tuple(column), tuple(row), dp_axis, strict=strict))


def _zero_hints(st: Strategy, axis: int, ndim: int, shard_params: bool) -> None:
    s0 = _nd(axis, ndim, S(0))
    if shard_params:
        st.hint("*", s0, "ZeRO: parameters stored sharded", role="param", only_if_fits=True, required=False)
        st.hint("*", tuple(B for _ in range(ndim)), "ZeRO: parameters gathered for use", role="param", use=True,
                required=False)
    st.hint("*", s0, "ZeRO: gradients reduce-scattered", role="grad", only_if_fits=True, required=False)
    st.hint("*", s0, "ZeRO: optimizer state sharded", role="state", only_if_fits=True, required=False)


def data_parallel(mesh: Placement | int, micro_batches: int = 1) -> Strategy:
    """Batch split on every rank, parameters replicated; gradients all-reduced by the optimizer's signature."""
    pl = as_mesh(mesh)
    st = Strategy(pl, micro_batches=micro_batches, name=f"data parallel x{pl.size}")
    # on an n-D mesh the batch is split over every axis: (S(0), S(0)) nests the splits
    st.hint("*", tuple(S(0) for _ in range(pl.ndim)), "data parallel: batch split", role="input", required=False)
    return st


def tensor_parallel(mesh: Placement | int, column: Sequence[str] = COLUMN, row: Sequence[str] = ROW,
                    micro_batches: int = 1) -> Strategy:
    """Megatron: column-parallel then row-parallel layers, one all-reduce per pair forward and backward."""
    pl = as_mesh(mesh)
    if pl.ndim != 1:
        raise InputError(f"tensor_parallel needs a 1-D mesh, got shape {pl.shape}; for data parallel x tensor "
                         f"parallel on a 2-D mesh use presets.dp_tp({pl.shape})")
    st = Strategy(pl, micro_batches=micro_batches, name=f"Megatron tensor parallel x{pl.size}")
    _tp_hints(st, 0, 1, column, row)
    return st


def dp_tp(mesh: Placement | Sequence[int], column: Sequence[str] = COLUMN, row: Sequence[str] = ROW,
          micro_batches: int = 1) -> Strategy:
    """2-D mesh (dp, tp): batch split on axis 0, Megatron on axis 1."""
    pl = as_mesh(mesh, ("dp", "tp") if isinstance(mesh, (tuple, list)) and len(mesh) == 2 else None)
    if pl.ndim != 2:
        raise InputError(f"dp_tp needs a 2-D mesh (dp, tp) such as (2, 2) or a 2-D sl.Placement, got "
                         f"{mesh!r} (shape {pl.shape}); for one mesh axis use data_parallel or tensor_parallel")
    st = Strategy(pl, micro_batches=micro_batches, name=f"DP x TP {pl.shape[0]}x{pl.shape[1]}")
    _dp_hints(st, 0, 2)
    _tp_hints(st, 1, 2, column, row, dp_axis=0)
    return st


def zero(mesh: Placement | int, shard_params: bool = True, micro_batches: int = 1) -> Strategy:
    """ZeRO data parallel: gradients and optimizer state ``S(0)``; parameters stored ``S(0)`` and
    gathered for use (``shard_params``, stage 3), or kept ``B`` and re-gathered after the update (stage 2)."""
    pl = as_mesh(mesh)
    if pl.ndim != 1:
        raise InputError(f"zero needs a 1-D mesh, got shape {pl.shape}")
    st = Strategy(pl, micro_batches=micro_batches, name=f"ZeRO-{3 if shard_params else 2} x{pl.size}")
    _dp_hints(st, 0, 1)
    _zero_hints(st, 0, 1, shard_params)
    return st


def pipeline(stages: int, micro_batches: int, ranks_per_stage: int | Sequence[int] = 1, inner: str = "none",
             stage_of: dict[str, int] | None = None, column: Sequence[str] = COLUMN,
             row: Sequence[str] = ROW, device_type: str | None = None) -> Strategy:
    """``stages`` pipeline stages on consecutive ranks, ``micro_batches`` per step.

    Inside each stage: ``inner`` = "none" (one rank), "dp", "tp", "zero" (a 1-D mesh of
    ``ranks_per_stage``) or "dp_tp" (a 2-D mesh, ``ranks_per_stage=(dp, tp)``). The stages are
    device-free unless ``device_type`` ("cpu", "cuda") binds them.
    """
    if stages < 1:
        raise InputError(f"pipeline needs stages >= 1, got {stages}")
    shape = (ranks_per_stage,) if isinstance(ranks_per_stage, int) else tuple(ranks_per_stage)
    if inner == "dp_tp" and len(shape) != 2:
        raise InputError("pipeline(inner='dp_tp') needs ranks_per_stage=(dp, tp)")
    if inner not in ("none", "dp", "tp", "zero", "dp_tp"):
        raise InputError(f"inner must be one of none, dp, tp, zero, dp_tp; got {inner!r}")
    k = 1
    for s in shape:
        k *= s
    placements = []
    for i in range(stages):
        ranks: list = list(range(i * k, (i + 1) * k))
        for s in reversed(shape[1:]):
            ranks = [ranks[j:j + s] for j in range(0, len(ranks), s)]
        placements.append(Placement(device_type, ranks))
    nd = len(shape)
    st = Strategy(placements[0], stages=placements, stage_of=dict(stage_of or {}), micro_batches=micro_batches,
                  name=f"pipeline {stages} stages x {micro_batches} micro-batches" + (f", {inner} inside" if inner != "none" else ""))
    if inner in ("dp", "zero"):
        _dp_hints(st, 0, nd)
    if inner == "zero":
        _zero_hints(st, 0, nd, True)
    if inner == "tp":
        _tp_hints(st, 0, nd, column, row)
    if inner == "dp_tp":
        _dp_hints(st, 0, nd)
        _tp_hints(st, 1, nd, column, row, dp_axis=0)
    return st
