"""Identical layers deduced once: each op of a repeated layer takes the ranking its twin in the layer
before it got, when it asks the same question.

A 24-layer transformer's training graph holds 24 copies of one layer's forward and backward ops
(``frontend/layer_repeat.py`` captures one and copies it). Deduction is greedy and in graph order: an op's
ranking of its signatures is a pure function of its type, input shapes, attributes, placements, the SBP
its inputs arrive in, the SBP its outputs must end in and the pins on its inputs (``ranking.rank_signatures``).
Where an op and its twin one layer earlier agree on all of that, the twin's ranking is the op's
ranking, so the op takes it as it is instead of asking again; its inputs are still boxed and its reason
still written for its own tensors, so the deduction is the one a full pass gives, boxing for boxing
(tests compare every signature and every boxing). The parts that never change between layers (type,
shapes, attributes, placements) are compared once, when the twins are paired; the SBP parts are compared
as each op is chosen, so a layer reached in another layout than its twin (the first layer after the
embeddings, the last before the head) is ranked in full.

Layers are found from module paths: ``transformer.h.7.mlp.c_fc`` is layer 7 of the stack
``transformer.h``. Any list of numbered modules qualifies; pairing checks what must be equal.
"""

from __future__ import annotations

import contextlib

from ...shortcut import Shortcut
from ..ir import Graph, OpNode

TWINS = Shortcut()  # off: every op ranks its own signatures, none copied from a twin


def every_layer_ranked() -> contextlib.AbstractContextManager[None]:
    """Rank every op's signatures inside this block, none copied from a twin (the reference the
    shortcut is tested against)."""
    return TWINS.off()


def _layer_of(module: str, memo: dict[str, tuple[str, int] | None]) -> tuple[str, int] | None:
    """(stack path, layer index) of a module path inside a numbered list of modules, or None."""
    if module in memo:
        return memo[module]
    parts = module.split(".")
    found = next(((".".join(parts[:k]), int(p)) for k, p in enumerate(parts) if p.isdigit()), None)
    memo[module] = found
    return found


def _alike(g: Graph, a: OpNode, b: OpNode, placement_of: dict) -> bool:
    """The parts of a ranking question that never change while deducing: the same for both ops. (Lists
    compare their items by identity first: twins' metas, placements and argument slots are mostly the
    same objects, so this costs little.)"""
    if a.type != b.type or len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
        return False
    if a.placement is not b.placement and a.placement != b.placement:
        return False
    ts = g.tensors
    if [ts[x].meta for x in a.inputs] != [ts[y].meta for y in b.inputs]:
        return False
    if [placement_of[x] for x in a.inputs] != [placement_of[y] for y in b.inputs]:
        return False
    return a.attrs == b.attrs


def layer_twins(g: Graph, placement_of: dict) -> dict[str, str]:
    """op name -> its twin in the layer whose first op comes just before its own layer's (same stack, phase
    and place in the layer, alike in type, shapes, attributes and placements); ops of no repeated layer
    are absent. A twin not yet deduced when its op is (interleaved layers) is simply not used.
    ``placement_of``: every tensor's placement (the inputs' placements are part of the question)."""
    if not TWINS.on:
        return {}
    memo: dict[str, tuple[str, int] | None] = {}
    layers: dict[tuple[str, str, int], list[OpNode]] = {}  # (stack, phase, layer) -> its ops in graph order
    for op in g.ops:
        where = _layer_of(op.module, memo) if op.module else None
        if where is not None:
            layers.setdefault((where[0], op.phase, where[1]), []).append(op)
    runs: dict[tuple[str, str], list[list[OpNode]]] = {}  # (stack, phase) -> its layers, by their first op
    for (stack, phase, _), ops in layers.items():
        runs.setdefault((stack, phase), []).append(ops)
    twins: dict[str, str] = {}
    for run in runs.values():
        for before, ops in zip(run, run[1:]):
            if len(before) != len(ops):
                continue
            for a, b in zip(before, ops):
                if _alike(g, a, b, placement_of):
                    twins[b.name] = a.name
    return twins
