"""Notebook widgets (anywidget). Importing this module needs the ``notebook`` extra installed."""

from __future__ import annotations

from .model_builder import ModelBuilder
from .playground import SbpPlayground, button_testid, sbp_choices
from .run_panel import RunPanel
from .strategy_editor import StrategyEditor
from .zoo import BuiltModel

__all__ = ["BuiltModel", "ModelBuilder", "RunPanel", "SbpPlayground", "StrategyEditor", "button_testid",
           "sbp_choices"]
