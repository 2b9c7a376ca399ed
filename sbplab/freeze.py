"""``freeze``: op attributes as a hashable value, so they can key caches and sit in frozen specs.

One rule everywhere (the graph's attributes, the registry's signature cache, the deduction's caches):
lists and tuples (``torch.Size`` too) become tuples, dicts become their items sorted by key,
recursively; anything else is kept as it is.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


def freeze(x: Any) -> Hashable:
    """``freeze({"dims": [0, 1], "keep": True}) == (("dims", (0, 1)), ("keep", True))``."""
    if isinstance(x, dict):
        return tuple(sorted((k, freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(freeze(v) for v in x)
    return x
