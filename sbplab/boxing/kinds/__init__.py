"""Boxing step kinds, one object per kind, each defined once: see ``kind_base.StepKind``.

``KINDS`` maps names to kinds, ``kind_of(name)`` looks one up, ``register`` adds one (a class plus
``register`` is all a new kind takes). Importing this package registers the built-in kinds.
"""

from __future__ import annotations

from . import all_to_all_kind, broadcast_kind, local_kinds, p2p_kinds, ring_kinds  # noqa: F401  (register)
from .kind_base import Pending, StepKind, kernel_ref
from .kind_registry import (
    KINDS,
    collective_names,
    kind_of,
    kinds_between,
    on_change,
    register,
    registered,
    unregister,
)

__all__ = ["KINDS", "Pending", "StepKind", "collective_names", "kernel_ref", "kind_of", "kinds_between",
           "on_change", "register", "registered", "unregister"]
