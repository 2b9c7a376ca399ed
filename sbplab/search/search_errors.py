"""The one error a search raises for bad requests: what was wrong, and what would be valid."""

from __future__ import annotations

from ..errors import SbplabError


class SearchError(SbplabError, ValueError):
    """A search request that cannot be served (devices, model, memory limit, method, budget)."""
