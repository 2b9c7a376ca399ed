"""Placement: a device type and an n-D mesh of ranks, kept exactly in the order written.

OneFlow silently sorts the ranks of a placement (their issue #9727); we never do, because the
order of ranks on a mesh axis is the order of pieces of a split tensor.

The device type may be left unbound (``None``, or ``"any"`` as written): presets, search results and
``Placement(ranks=...)`` are device-free, and the device is bound when a step is compiled for one
(``bind_device``) or run on a cluster (the cluster's device). Where an unbound placement is read
before that, it means: this process's CPU for eager global tensors and in-process execution, the
Hardware's device in the simulator and the search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import InputError, InputKeyError, InputTypeError

DEVICE_TYPES = ("cpu", "cuda")
UNBOUND = "any"  # what a device-free placement may be written as, besides None


def _nested_tuple(x) -> tuple | int:
    if isinstance(x, (list, tuple, np.ndarray)):
        return tuple(_nested_tuple(y) for y in x)
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    raise InputTypeError(f"placement ranks must be ints or nested lists of ints, got {x!r}")


@dataclass(frozen=True)
class Placement:
    """Where a tensor lives: ``Placement("cpu", [[0, 1], [2, 3]], axis_names=("dp", "tp"))``.

    ``ranks`` may be an int count (``4`` means ``[0, 1, 2, 3]``), a flat list, or a nested list
    describing an n-D mesh. ``device_type`` None (or ``"any"``; ``Placement(ranks=[0, 1])``) leaves the
    device unbound: the strategy compiles for any device, bound by ``sl.compile(..., device=...)`` or
    by the cluster that runs the step (``bind``).
    """

    device_type: str | None = None
    ranks: tuple = field(default=())
    axis_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.device_type == UNBOUND:
            object.__setattr__(self, "device_type", None)
        if self.device_type is not None and self.device_type not in DEVICE_TYPES:
            raise InputError(f"device_type must be one of {DEVICE_TYPES}, got {self.device_type!r}")
        ranks = self.ranks
        if isinstance(ranks, (int, np.integer)) and not isinstance(ranks, bool):
            if ranks < 1:
                raise InputError(f"a placement needs at least one rank, got {ranks}")
            ranks = list(range(int(ranks)))
        nested = _nested_tuple(ranks)
        if isinstance(nested, int):
            nested = (nested,)
        try:
            mesh = np.array(nested, dtype=np.int64)
        except ValueError as e:  # ragged nesting
            raise InputError(f"placement ranks {ranks!r} are not a rectangular mesh") from e
        if mesh.size == 0:
            raise InputError("a placement needs at least one rank")
        if mesh.dtype != np.int64 or mesh.ndim == 0:
            raise InputError(f"placement ranks {ranks!r} are not a rectangular mesh of ints")
        flat = mesh.reshape(-1).tolist()
        if len(set(flat)) != len(flat):
            dup = sorted({r for r in flat if flat.count(r) > 1})
            raise InputError(f"placement ranks must be distinct; repeated: {dup}")
        if min(flat) < 0:
            raise InputError(f"placement ranks must be >= 0, got {min(flat)}")
        object.__setattr__(self, "ranks", _nested_tuple(mesh.tolist()))
        if self.axis_names is not None:
            names = tuple(self.axis_names)
            if len(names) != mesh.ndim:
                raise InputError(
                    f"axis_names {names} has {len(names)} names but the mesh has {mesh.ndim} axes"
                )
            if len(set(names)) != len(names):
                raise InputError(f"axis_names must be distinct, got {names}")
            object.__setattr__(self, "axis_names", names)

    # --- device ----------------------------------------------------------------------------------
    @property
    def bound(self) -> bool:
        """True when the device type is fixed; False for a device-free placement."""
        return self.device_type is not None

    def bind(self, device_type: str | None) -> Placement:
        """This placement on ``device_type``: an unbound one takes it, a bound one must already be on it
        (an InputError otherwise). ``None`` leaves the placement as it is."""
        if device_type is None or device_type == self.device_type:
            return self
        if device_type not in DEVICE_TYPES:
            raise InputError(f"device_type must be one of {DEVICE_TYPES}, got {device_type!r}")
        if self.device_type is not None:
            raise InputError(f"{self} is for {self.device_type}, not {device_type}; write it device-free "
                             f"(sl.Placement(None, ...)) to bind it to any device")
        return Placement(device_type, self.ranks, self.axis_names)

    def unbound(self) -> Placement:
        """The same mesh with its device left unbound."""
        return self if self.device_type is None else Placement(None, self.ranks, self.axis_names)

    # --- shape of the mesh -------------------------------------------------------------------
    @cached_property
    def mesh(self) -> np.ndarray:
        """The mesh as an int array, shape ``self.shape``."""
        return np.array(self.ranks, dtype=np.int64)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def size(self) -> int:
        return int(self.mesh.size)

    @cached_property
    def rank_list(self) -> tuple[int, ...]:
        """All ranks in mesh (row-major) order."""
        return tuple(int(r) for r in self.mesh.reshape(-1))

    @cached_property
    def _coords(self) -> dict[int, tuple[int, ...]]:
        return {int(self.mesh[idx]): tuple(int(i) for i in idx) for idx in np.ndindex(self.shape)}

    def coords(self, rank: int) -> tuple[int, ...]:
        """Mesh coordinates of ``rank``."""
        try:
            return self._coords[rank]
        except KeyError:
            raise InputKeyError(f"rank {rank} is not in placement {self}") from None

    def rank_at(self, coords: Sequence[int]) -> int:
        return int(self.mesh[tuple(coords)])

    def axis_index(self, axis: int | str) -> int:
        if isinstance(axis, str):
            if not self.axis_names or axis not in self.axis_names:
                raise InputError(f"no mesh axis named {axis!r}; axes are {self.axis_names}")
            return self.axis_names.index(axis)
        if not -self.ndim <= axis < self.ndim:
            raise InputError(f"mesh axis {axis} out of range for a {self.ndim}-D mesh")
        return axis % self.ndim

    def axis_label(self, axis: int) -> str:
        return self.axis_names[axis] if self.axis_names else f"axis{axis}"

    def groups(self, axis: int | str) -> list[tuple[int, ...]]:
        """The rank groups that talk over mesh ``axis``: ranks that differ only on that axis."""
        a = self.axis_index(axis)
        moved = np.moveaxis(self.mesh, a, -1).reshape(-1, self.shape[a])
        return [tuple(int(r) for r in row) for row in moved]

    def group_of(self, rank: int, axis: int | str) -> tuple[int, ...]:
        a = self.axis_index(axis)
        c = list(self.coords(rank))
        out = []
        for i in range(self.shape[a]):
            c[a] = i
            out.append(self.rank_at(c))
        return tuple(out)

    def __contains__(self, rank: int) -> bool:
        return rank in self._coords

    def __repr__(self) -> str:
        names = f", axis_names={self.axis_names}" if self.axis_names else ""
        return f"Placement({self.device_type!r}, {list(self.mesh.tolist())}{names})"

    def __hash__(self) -> int:
        return hash((self.device_type, self.ranks, self.axis_names))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Placement) and self.device_type == other.device_type
                and self.ranks == other.ranks and self.axis_names == other.axis_names)

    def same_devices(self, other: Placement) -> bool:
        """Same device type and the same mesh (axis names aside)."""
        return self.device_type == other.device_type and self.ranks == other.ranks
