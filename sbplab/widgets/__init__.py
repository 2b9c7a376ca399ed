"""Notebook widgets (anywidget). Importing this module needs the ``notebook`` extra installed."""

from __future__ import annotations

from .playground import SbpPlayground, button_testid, sbp_choices

__all__ = ["SbpPlayground", "button_testid", "sbp_choices"]
