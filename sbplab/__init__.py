"""sbplab: OneFlow-style SBP parallelism you can read, run and see.

    import sbplab as sl
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    x = sl.tensor(torch.randn(8, 6), placement=mesh, sbp="S(0), S(1)")

The core (this package minus ``sbplab.widgets``) never imports Jupyter; plotly and graphviz load
only when a picture is drawn.
"""

from __future__ import annotations

from . import models, ops  # importing ops registers every op
from .boxing import BoxingPlan, plan_boxing
from .compiler import (
    SGD,
    Adam,
    AdamW,
    Compiled,
    GraphBuilder,
    Strategy,
    compile,
    compile_graph,
    from_torch,
    presets,
)
from .eager import (
    GlobalTensor,
    SignatureError,
    apply,
    explain,
    explain_log,
    from_local,
    set_default_hardware,
    tensor,
)
from .hardware import Hardware
from .layout import assemble, balanced_sizes, local_block, local_shape, random_shards, shard, split_range
from .placement import Placement
from .runtime import LocalCluster
from .sbp import B, Broadcast, P, Partial, S, Split, fmt_sbp, parse_sbp
from .search import search
from .sim import simulate
from .viz import compare_timelines, layout_picture, timeline, type_string

__all__ = [
    # semantics
    "B", "Broadcast", "P", "Partial", "Placement", "S", "Split", "fmt_sbp", "parse_sbp",
    "assemble", "balanced_sizes", "local_block", "local_shape", "random_shards", "shard", "split_range",
    # eager global tensors and boxing
    "BoxingPlan", "Hardware", "GlobalTensor", "SignatureError", "apply", "explain", "explain_log",
    "from_local", "plan_boxing", "set_default_hardware", "tensor", "ops",
    # compiler
    "Adam", "AdamW", "Compiled", "GraphBuilder", "SGD", "Strategy", "compile", "compile_graph",
    "from_torch", "models", "presets",
    # runtime and pictures
    "LocalCluster", "compare_timelines", "layout_picture", "search", "simulate", "timeline", "type_string",
]
