"""Pipeline schedules: the per-rank order of forward and backward actions (``schedules.py``)."""

from .schedules import SCHEDULES, pipeline_actions

__all__ = ["SCHEDULES", "pipeline_actions"]
