"""Data parallel and ZeRO: the batch split over a mesh axis, and what of the training state is sharded
over it (ZeRO levels 1-3: optimizer state, then gradients, then parameters)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ....errors import InputError
from ....sbp import B, S
from .base import ParallelRule, RuleUse, on_axis, stage_mesh

if TYPE_CHECKING:
    from ...ir import Graph
    from ..strategy import Strategy


@dataclass(frozen=True)
class DataParallel(ParallelRule):
    """The batch (every model input) split on dim 0 over mesh axis ``axis``; parameters stay whole there,
    so their gradients are all-reduced over it (the optimizer's signature asks for it).

    ``axis`` None: every mesh axis (a nested split, ``(S(0), S(0))``), the ``data_parallel`` preset."""

    axis: str | int | None = "dp"

    def axes(self, strategy: Strategy) -> list[int]:
        mesh = stage_mesh(strategy)
        return list(range(mesh.ndim)) if self.axis is None else [self.axis_index(mesh)]

    def resolve(self, graph: Graph, strategy: Strategy) -> RuleUse:
        from ..strategy import Hint

        mesh = stage_mesh(strategy)
        axes = self.axes(strategy)
        sbp = tuple(S(0) if a in axes else B for a in range(mesh.ndim))
        where = "every mesh axis" if self.axis is None else f"mesh axis {mesh.axis_label(axes[0])}"
        hint = Hint("*", sbp, f"data parallel: batch split on {where}", role="input", required=False)
        n = sum(1 for t in graph.tensors.values() if t.role == "input")
        return RuleUse([hint], [f"batch split on dim 0 over {where}: {n} input(s)"], applied=n > 0)

    def describe(self) -> str:
        return f"DataParallel({self.axis!r})"


@dataclass(frozen=True)
class ZeRO(ParallelRule):
    """ZeRO over mesh axis ``axis`` (the data-parallel one): level 1 shards the optimizer state, 2 also
    reduce-scatters the gradients, 3 also stores the parameters sharded and gathers them for use.
    Tensors too small to split over the axis stay whole (the report counts them)."""

    level: int = 3
    axis: str | int = "dp"

    def __post_init__(self) -> None:
        if self.level not in (1, 2, 3):
            raise InputError(f"ZeRO level must be 1 (optimizer state), 2 (+ gradients) or 3 (+ parameters), "
                             f"got {self.level!r}")

    def resolve(self, graph: Graph, strategy: Strategy) -> RuleUse:
        from ..strategy import Hint

        mesh = stage_mesh(strategy)
        a = self.axis_index(mesh)
        s0, whole = on_axis(a, mesh.ndim, S(0)), tuple(B for _ in range(mesh.ndim))
        hints = []
        if self.level >= 3:
            hints += [Hint("*", s0, "ZeRO: parameters stored sharded", role="param", only_if_fits=True, required=False),
                      Hint("*", whole, "ZeRO: parameters gathered for use", role="param", use=True, required=False)]
        if self.level >= 2:
            hints.append(Hint("*", s0, "ZeRO: gradients reduce-scattered", role="grad", only_if_fits=True,
                              required=False))
        hints.append(Hint("*", s0, "ZeRO: optimizer state sharded", role="state", only_if_fits=True, required=False))
        what = {1: "optimizer state", 2: "gradients and optimizer state", 3: "parameters, gradients and optimizer state"}
        return RuleUse(hints, [f"ZeRO-{self.level}: {what[self.level]} sharded over mesh axis {mesh.axis_label(a)}"])

    def describe(self) -> str:
        return f"ZeRO({self.level}, {self.axis!r})"
