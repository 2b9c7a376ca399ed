"""Notebook widgets (anywidget). Importing this module needs the ``notebook`` extra installed."""

from __future__ import annotations

from .model_builder import ModelBuilder
from .playground import SbpPlayground, button_testid, sbp_choices
from .run_panel import RunPanel
from .search_panel import SearchPanel
from .strategy_editor import StrategyEditor
from .zoo import BuiltModel

__all__ = ["BuiltModel", "ModelBuilder", "RunPanel", "SbpPlayground", "SearchPanel", "StrategyEditor",
           "button_testid", "sbp_choices"]
