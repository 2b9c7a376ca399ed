"""The one error a search raises for bad requests: what was wrong, and what would be valid."""

from __future__ import annotations


class SearchError(ValueError):
    """A search request that cannot be served (devices, model, memory limit, method, budget)."""
