"""A parallelism as a rule over named mesh axes (torchtitan's ParallelDims, one apply per parallelism).

A rule is written before any model is seen: ``DataParallel("dp")``, ``TensorParallel("tp")``. It names
the mesh axis it works on; ``setup`` shapes the strategy once (a pipeline cuts the mesh into stages),
and ``resolve`` meets the training graph and hands back the hints it needs plus a report of what it
did and what it could not do, so every strategy is hints in the end and deduction stays one mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ....errors import InputError
from ....placement import Placement
from ....sbp import B

if TYPE_CHECKING:
    from ...ir import Graph
    from ..strategy import Hint, Strategy

@dataclass
class RuleUse:
    """What one rule did to one graph: its hints, report lines, and warnings to raise at compile time."""

    hints: list[Hint] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    applied: bool = True  # False: the rule found nothing to act on
    pairing: object = None  # TensorParallel: the Megatron pairing it found


class ParallelRule:
    """Base of the parallelism rules; subclasses are frozen dataclasses with an ``axis`` field.

    ``splits_weights``: the rule stores weights split inside a stage (staging then keeps gradient
    partial sums 1:1 across stage cuts instead of summing them on the later stage).
    """

    splits_weights: ClassVar[bool] = False
    axis: object = None

    def setup(self, strategy: Strategy) -> None:
        """Shape the strategy before any graph is known (stages, micro-batches); most rules need nothing."""

    def resolve(self, graph: Graph, strategy: Strategy) -> RuleUse:
        raise NotImplementedError

    def describe(self) -> str:
        return repr(self)

    def axis_index(self, mesh: Placement, axis: object = None) -> int:
        """The rule's axis (a name or an index) as an index of ``mesh``, with an error naming the axes."""
        return resolve_axis(mesh, self.axis if axis is None else axis, type(self).__name__)


def resolve_axis(mesh: Placement, axis: object, who: str) -> int:
    if isinstance(axis, int) and not isinstance(axis, bool):
        if not 0 <= axis < mesh.ndim:
            raise InputError(f"{who}: mesh axis {axis} is out of range for a {mesh.ndim}-D mesh {mesh.shape}")
        return axis
    if isinstance(axis, str):
        if mesh.axis_names and axis in mesh.axis_names:
            return mesh.axis_names.index(axis)
        if not mesh.axis_names and mesh.ndim == 1:
            return 0  # a 1-D mesh without names: its one axis, whatever the rule calls it
        named = f"axes are {list(mesh.axis_names)}" if mesh.axis_names else "the mesh's axes have no names"
        raise InputError(f"{who}({axis!r}): the mesh {mesh.shape} has no axis named {axis!r}; {named} "
                         f"(name them: sl.mesh(dp=2, tp=2), or give the axis as an int)")
    raise InputError(f"{who}: a mesh axis is a name ('dp') or an int, got {axis!r}")


def on_axis(axis: int, ndim: int, x: object) -> tuple:
    """``x`` on mesh axis ``axis``, ``B`` on the others: one rule speaks only for its own axis."""
    return tuple(x if a == axis else B for a in range(ndim))


def stage_mesh(strategy: Strategy) -> Placement:
    """The mesh rules work on: a pipeline stage's (all stages have the same shape), else the placement."""
    return strategy.stages[0] if strategy.stages else strategy.placement


def mesh(device_type: str | None = None, **axes: int) -> Placement:
    """A device-free n-D mesh with named axes, in the order given: ``sl.mesh(dp=2, tp=4)`` is ranks
    ``[[0, 1, 2, 3], [4, 5, 6, 7]]`` with axis names ``("dp", "tp")``: the last axis's ranks are
    consecutive (put tensor parallel last, where the fastest links are, as torchtitan and Megatron do)."""
    if not axes:
        raise InputError("sl.mesh needs at least one named axis, e.g. sl.mesh(dp=2, tp=4)")
    bad = {k: v for k, v in axes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad:
        raise InputError(f"sl.mesh axis sizes must be ints >= 1, got {bad}")
    from ..presets import as_mesh

    return as_mesh(tuple(axes.values()), tuple(axes)).bind(device_type)
