"""Exports of a compiled step to other systems' words: ``to_dtensor`` (PyTorch DTensor), and ``coverage``:
how much of the step DTensor's own sharding propagation expresses.

``import sbplab`` does not load this package, and it loads torch.distributed only when an export is
applied to a module.
"""

from __future__ import annotations

from .coverage import Coverage, OpVerdict, coverage
from .dtensor import DTensorExport, to_dtensor
from .local_maps import LocalMapCall
from .placements import DTensorPlacement

__all__ = ["Coverage", "DTensorExport", "DTensorPlacement", "LocalMapCall", "OpVerdict", "coverage", "to_dtensor"]
