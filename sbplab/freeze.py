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


def freeze_attrs(attrs: dict) -> Hashable:
    """``freeze(attrs)`` for an op's attributes, without walking them when they are hashable already.

    A graph's attributes are frozen when the op is added, so each later cache key (shape inference, FLOPs,
    scored signatures: tens of thousands per compile of a large model) would walk tuples that are already
    tuples. Hashable values compare and hash as their frozen form (a ``torch.Size`` as its tuple), so the
    key is the same; anything unhashable (a list, a dict) takes ``freeze``."""
    items = tuple(sorted(attrs.items()))
    try:
        hash(items)
    except TypeError:
        return freeze(attrs)
    return items
