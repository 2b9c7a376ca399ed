"""Automatic strategy search: exact (ILP), coordinate descent, MCMC and exhaustive, over one cost model.

``search`` (``sl.search``) is the entry point; ``cost.py`` is the one analytic cost model the methods
share; ``problem.py`` lays a training graph out as choices and edges on one mesh.

``sl.search`` is this package, and calling it calls ``search``: ``sl.search(model, ...)`` runs a search
while ``import sbplab.search.cost`` (and ``sl.search.cost`` after it) still reach the modules. (Were
``sl.search`` the function, it would hide the package: ``from sbplab.search import cost`` would fail.)
"""

from __future__ import annotations

import sys
import types

from .result import Predicted, SearchResult
from .search_api import search
from .search_errors import SearchError
from .search_progress import SearchProgress

__all__ = ["Predicted", "SearchError", "SearchProgress", "SearchResult", "search"]


class _SearchPackage(types.ModuleType):
    """The ``sbplab.search`` package, callable as its ``search`` function."""

    def __call__(self, *args, **kwargs) -> SearchResult:
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _SearchPackage
__wrapped__ = search  # inspect.signature(sl.search) is the function's signature
__doc__ = f"{__doc__}\n``search``: {search.__doc__}" if search.__doc__ else __doc__
