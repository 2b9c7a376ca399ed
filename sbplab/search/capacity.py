"""How much memory one device of a ``Hardware`` holds, and the bound on how many devices a search plans.

Why here: the search uses a device's capacity as its default ``memory_limit`` (a strategy that needs
143 GiB per GPU cannot run on an 80 GB one, however fast it would be), and the simulator warns with
the same figure. The capacity belongs to the machine model; a Hardware that does not know it (a
hand-built one, an older calibration) gives None and nothing is filtered.
"""

from __future__ import annotations

import numbers

from ..hardware import Hardware
from .search_errors import SearchError

CAPACITY_FIELDS = ("memory_bytes", "memory_capacity", "device_memory")  # the machine model's name for it

# Beyond this the search's own bookkeeping (one problem per mesh, every divisor a mesh axis) grows without
# telling anything new: the largest published training runs use 16k-100k GPUs, and a strategy for them
# is a few replicated groups of at most a few thousand devices each.
MAX_DEVICES = 131072


def device_capacity(hw: Hardware) -> float | None:
    """Bytes of memory on one device of ``hw``, or None where the machine model does not say."""
    for name in CAPACITY_FIELDS:
        v = getattr(hw, name, None)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    return None


def check_device_bound(devices: object) -> None:
    """A device count above ``MAX_DEVICES`` is refused before any work, with the bound named."""
    if isinstance(devices, numbers.Integral) and not isinstance(devices, bool) and devices > MAX_DEVICES:
        raise SearchError(f"sl.search: devices={devices} is more than the {MAX_DEVICES} ranks a search plans for "
                          f"(the largest training runs published use 16k-100k GPUs); search the repeated "
                          f"group instead (e.g. one node or one pipeline stage) and replicate it")
