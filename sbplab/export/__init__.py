"""Exports of a compiled step to other systems' words: ``to_dtensor`` (PyTorch DTensor).

``import sbplab`` does not load this package, and it loads torch.distributed only when an export is
applied to a module.
"""

from __future__ import annotations

from .dtensor import DTensorExport, to_dtensor
from .placements import DTensorPlacement

__all__ = ["DTensorExport", "DTensorPlacement", "to_dtensor"]
