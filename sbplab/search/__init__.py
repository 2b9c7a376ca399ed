"""Automatic strategy search: exact (ILP), coordinate descent, MCMC and exhaustive, over one cost model.

``search`` (``sl.search``) is the entry point; ``cost.py`` is the one analytic cost model the methods
share; ``problem.py`` lays a training graph out as choices and edges on one mesh.
"""

from __future__ import annotations

from .result import Predicted, SearchResult
from .search_api import search
from .search_errors import SearchError
from .search_progress import SearchProgress

__all__ = ["Predicted", "SearchError", "SearchProgress", "SearchResult", "search"]
