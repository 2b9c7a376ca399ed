"""sbplab: OneFlow-style SBP parallelism you can read, run and see.

    import sbplab as sl
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    x = sl.tensor(torch.randn(8, 6), placement=mesh, sbp="S(0), S(1)")

The core (this package minus ``sbplab.widgets``) never imports Jupyter; plotly and graphviz load
only when a picture is drawn.
"""

from __future__ import annotations

# importing ops registers every op; search is the package, callable as its function: sl.search(model, ...)
from . import models, ops, search
from .boxing import BoxingError, BoxingPlan, plan_boxing
from .compiler import (
    SGD,
    Adam,
    AdamW,
    Compiled,
    GraphBuilder,
    GraphError,
    HintError,
    Strategy,
    compile,
    compile_graph,
    from_torch,
    presets,
)
from .compiler.deduction.parallel import DataParallel, Pipeline, TensorParallel, ZeRO, mesh
from .compiler.deduction.precision import Precision
from .compiler.deduction.strategy import TensorParallelError, TensorParallelWarning
from .compiler.frontend.aten_capture import CaptureError, LocalOnlyOpWarning, ReplicatedOpWarning
from .compiler.frontend.from_torch import UnsupportedError, UnsupportedModelError
from .compiler.reference import compare as compare_with_torch
from .compiler.reference import torch_steps
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
from .errors import ClusterError, InputError, InputKeyError, InputTypeError, OpError, SbpError, SbplabError
from .hardware import Hardware
from .layout import (
    LayoutError,
    assemble,
    balanced_sizes,
    local_block,
    local_shape,
    random_shards,
    shard,
    split_range,
)
from .machine import LinkLevel, Machine, MachineError
from .machine_device import DeviceModel
from .ops.aten import register_rule
from .ops.registry import Signature, UnknownOpError
from .placement import Placement
from .runtime import LocalCluster, PlanError, RunError, Trace
from .runtime.communicators import CommunicatorError
from .sbp import B, Broadcast, P, Partial, S, Split, fmt_sbp, parse_sbp
from .search import SearchError
from .sim import SimulationError, simulate
from .sim.memory_model import MemoryCapacityWarning
from .viz import compare_timelines, layout_picture, timeline, type_string

__all__ = [
    "CaptureError", "ReplicatedOpWarning", "LocalOnlyOpWarning", "TensorParallelWarning", "register_rule", "Signature",
    "MemoryCapacityWarning",
    # semantics
    "B", "Broadcast", "P", "Partial", "Placement", "S", "Split", "fmt_sbp", "parse_sbp",
    "assemble", "balanced_sizes", "local_block", "local_shape", "random_shards", "shard", "split_range",
    # eager global tensors and boxing
    "BoxingPlan", "Hardware", "Machine", "MachineError", "LinkLevel", "DeviceModel", "GlobalTensor", "apply", "explain", "explain_log",
    "from_local", "plan_boxing", "set_default_hardware", "tensor", "ops",
    # errors: every error sbplab raises on purpose is an SbplabError, and every one of them is here
    "SbplabError", "BoxingError", "ClusterError", "CommunicatorError", "GraphError", "HintError", "InputError", "InputKeyError",
    "InputTypeError", "LayoutError", "OpError", "PlanError", "RunError", "SbpError", "SearchError",
    "SignatureError", "SimulationError", "TensorParallelError", "UnknownOpError", "UnsupportedError", "UnsupportedModelError",
    # compiler
    "Adam", "AdamW", "Compiled", "GraphBuilder", "Precision", "SGD", "Strategy", "compile", "compile_graph",
    "from_torch", "models", "presets",
    # parallelisms as rules over named mesh axes: sl.Strategy(sl.mesh(dp=2, tp=2), [sl.DataParallel("dp"), ...])
    "DataParallel", "Pipeline", "TensorParallel", "ZeRO", "mesh",
    # ground truth: the same steps in plain single-device PyTorch
    "compare_with_torch", "torch_steps",
    # runtime and pictures
    "LocalCluster", "Trace", "compare_timelines", "layout_picture", "search", "simulate", "timeline",
    "type_string",
    # other systems' words (loaded on first use)
    "to_dtensor",
]


def __getattr__(name: str):
    """``sl.to_dtensor`` loads ``sbplab.export`` on first use: ``import sbplab`` stays without it."""
    if name == "to_dtensor":
        from .export import to_dtensor

        return to_dtensor
    raise AttributeError(f"module 'sbplab' has no attribute {name!r}")
