"""The compiler: torch modules to logical graphs, training graphs, SBP deduction and physical graphs.

The pipeline, one sub-package per stage: ``frontend`` (torch.fx import, hand-built graphs),
``training`` (autodiff, optimizers), ``deduction`` (strategies, hints, signature choice),
``physical`` (per-rank graph, memory, in-process executor), ``lowering`` (actor plans for the
runtime).
"""

from __future__ import annotations

from .. import models  # noqa: F401  (the zoo, also reachable as sl.models)
from ..ops.signature_text import SignatureError, parse_signature  # one class and parser, shared with eager
from .api import Compiled, compile, compile_graph
from .deduction import presets  # noqa: F401  (sl.presets)
from .deduction.caches import clear_caches
from .deduction.deduce import Deduction, deduce
from .deduction.ranking import Option, options
from .deduction.signature_hints import SignatureHint
from .deduction.strategy import Hint, HintError, Strategy
from .frontend.builder import GraphBuilder, Value
from .frontend.from_torch import UnsupportedModelError, from_torch
from .interpret import interpret
from .ir import Graph, GraphError, OpNode, TensorNode
from .physical.expand import lower
from .physical.graph import PhysCollective, PhysicalGraph, PhysNode, PhysRef
from .physical.local_executor import LocalExecutor
from .training.autodiff import add_backward, differentiate
from .training.optim import SGD, Adam, AdamW

__all__ = [
    "SGD", "Adam", "AdamW", "PhysCollective", "Compiled", "Deduction", "Graph", "GraphBuilder", "GraphError",
    "Hint", "HintError", "LocalExecutor", "OpNode", "PhysNode", "PhysicalGraph", "PhysRef", "Strategy",
    "TensorNode", "UnsupportedModelError", "Value", "add_backward", "compile", "compile_graph", "deduce",
    "differentiate", "from_torch", "interpret", "lower", "models", "presets",
    "Option", "SignatureError", "SignatureHint", "clear_caches", "options", "parse_signature",
]
