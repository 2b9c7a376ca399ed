"""Parallelisms as rules over named mesh axes, one file per parallelism (picotron's layout):
``DataParallel``, ``ZeRO``, ``TensorParallel`` (Megatron, from the graph's structure) and ``Pipeline``.
``Strategy(sl.mesh(dp=2, tp=2), [DataParallel("dp"), TensorParallel("tp")])`` composes them."""

from .base import ParallelRule, RuleUse, mesh
from .data_parallel import DataParallel, ZeRO
from .pipeline_parallel import SCHEDULES, Pipeline
from .tensor_parallel import TensorParallel

__all__ = ["SCHEDULES", "DataParallel", "ParallelRule", "Pipeline", "RuleUse", "TensorParallel", "ZeRO", "mesh"]
