"""sbplab: OneFlow-style SBP parallelism you can read, run and see.

    import sbplab as sl
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    x = sl.tensor(torch.randn(8, 6), placement=mesh, sbp="S(0), S(1)")
"""

from __future__ import annotations

from .layout import assemble, balanced_sizes, local_block, local_shape, shard, split_range
from .placement import Placement
from .sbp import B, Broadcast, P, Partial, S, Split, fmt_sbp, parse_sbp
from . import ops  # noqa: F401  (registers every op)
from .boxing import BoxingPlan, plan_boxing
from .cluster import Cluster
from .eager import (
    GlobalTensor, SignatureError, apply, explain, explain_log, from_local, set_default_cluster, tensor,
)
from .viz import compare_timelines, layout_picture, timeline, type_string  # noqa: F401  (plotly loads on use)
from .compiler import SGD, Adam, AdamW, GraphBuilder, Strategy, compile, compile_graph, from_torch, models, presets  # noqa: F401,E501
from .runtime import LocalCluster  # noqa: F401  (worker processes over torch.distributed)

__all__ = [
    "BoxingPlan", "Cluster", "GlobalTensor", "SignatureError", "apply", "explain", "explain_log",
    "from_local", "plan_boxing", "set_default_cluster", "tensor",
    "B", "Broadcast", "P", "Partial", "Placement", "S", "Split",
    "assemble", "balanced_sizes", "fmt_sbp", "local_block", "local_shape", "parse_sbp", "shard",
    "split_range",
]
