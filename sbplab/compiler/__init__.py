"""The compiler: torch modules to logical graphs, training graphs, SBP deduction and physical graphs.

Importing it registers the compiler's own ops (gradients, optimizer updates) and attaches the
gradient rules to the op library's ops.
"""

from __future__ import annotations

from .. import models  # noqa: F401  (the zoo, also reachable as sl.models)
from . import grad_ops, grad_ops_nn, optim_ops, presets  # noqa: F401  (registers ops)
from .api import Compiled, compile, compile_graph
from .autodiff import add_backward, differentiate
from .builder import GraphBuilder, Value
from .deduce import Deduction, deduce
from .executor import LocalExecutor
from .fx_frontend import UnsupportedModelError, from_torch
from .grad_rules import attach_rules
from .interpret import interpret
from .ir import Graph, GraphError, OpNode, TensorNode
from .lower import lower
from .memo import clear_caches
from .optim import SGD, Adam, AdamW
from .physical import Collective, PhysicalGraph, PhysNode, Ref
from .ranking import Option, options
from .signature_hints import SignatureError, SignatureHint, parse_signature
from .strategy import Hint, HintError, Strategy

attach_rules()

__all__ = [
    "SGD", "Adam", "AdamW", "Collective", "Compiled", "Deduction", "Graph", "GraphBuilder", "GraphError",
    "Hint", "HintError", "LocalExecutor", "OpNode", "PhysNode", "PhysicalGraph", "Ref", "Strategy",
    "TensorNode", "UnsupportedModelError", "Value", "add_backward", "compile", "compile_graph", "deduce",
    "differentiate", "from_torch", "interpret", "lower", "models", "presets",
    "Option", "SignatureError", "SignatureHint", "clear_caches", "options", "parse_signature",
]
