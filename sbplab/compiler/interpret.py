"""Run a logical graph on whole tensors, one device, no SBP: the meaning every parallel run must match.

Used to check the frontend (same outputs as the torch module) and autodiff (same gradients as
torch.autograd) before any layout enters the picture.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..ops.registry import get_op
from .ir import Graph, GraphError


def interpret(graph: Graph, feeds: Mapping[str, torch.Tensor], phases: tuple[str, ...] = ("forward", "backward"),
              state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Values of every tensor after running the ops of ``phases`` once (one micro-batch).

    ``feeds`` gives the data inputs; params, consts and states take their graph values unless
    ``state`` overrides them.
    """
    env: dict[str, torch.Tensor] = {}
    for name in graph.sources():
        t = graph.tensors[name]
        if t.role == "input":
            if name not in feeds:
                raise GraphError(f"input {name!r} was not fed; inputs are {graph.inputs}")
            env[name] = feeds[name]
        elif state is not None and name in state:
            env[name] = state[name]
        else:
            env[name] = t.initial_value()
    for op in graph.ops:
        if op.phase not in phases:
            continue
        outs = get_op(op.type).kernel([env[i] for i in op.inputs], dict(op.attrs))
        for n, v in zip(op.outputs, outs):
            env[n] = v
    return env
