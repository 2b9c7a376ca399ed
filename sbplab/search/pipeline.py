"""Pipelines: S stages of equal meshes, a contiguous cut of the layers, M micro-batches (GPipe).

Given each op's signature on the stage mesh (solved on the micro-batch graph), a dynamic program over
cut points (Alpa's, over layers) finds the contiguous cut into S stages that minimises the slowest
stage's time per micro-batch. Cuts fall only between layers (``problem.unit_of``: ``blocks.3``), the
granularity ``Strategy.stage_of`` speaks. A tensor crossing a cut pays a stage-to-stage move (and its
gradient the move back) instead of an in-mesh boxing.

Step time = (M + S - 1) * slowest stage per micro-batch + slowest stage's once-per-step work
(gradient sync, update): the bubble is the (S - 1) / (M + S - 1) share of it. Memory per device is the
largest stage's: its parameters, gradients and state, plus M micro-batches of activations in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .problem import OpProblem, OpSpace


@dataclass
class PipelineCost:
    step_time: float
    memory: int
    stage_of_op: list[int]
    stage_times: list[float]  # per micro-batch
    bubble: float  # (S - 1) / (M + S - 1)


def blocks_of(ops: Sequence[OpSpace]) -> list[list[int]]:
    """Ops (a problem's, in order) grouped into runs of one layer; ops of no layer join the run before them,
    and so do ops of a layer seen before (a transformers model's final norm, ``transformer.ln_f``, is in
    unit ``transformer`` with its embeddings): ``Strategy.stage_of`` gives a unit one stage, so a stage
    cut before such a run could not be compiled as priced (deduction keeps it on its producers' stage)."""
    blocks: list[list[int]] = []
    last = None
    seen: set[str] = set()
    for k, o in enumerate(ops):
        if blocks and (o.unit == last or not o.unit or o.unit in seen):
            blocks[-1].append(k)
        else:
            blocks.append([k])
            last = o.unit
            seen.add(o.unit)
    return blocks


def price_stages(problem: OpProblem, assign: list[int], zero: int, stage_of_op: list[int],
                 n_stages: int) -> PipelineCost:
    """The cost of one given cut (a stage per op), as the module docstring says."""
    M = problem.micro_batches
    per_micro = np.zeros(n_stages)
    per_step = np.zeros(n_stages)
    mem = np.zeros(n_stages)
    for k, o in enumerate(problem.ops):
        i, s = assign[k], stage_of_op[k]
        per_micro[s] += o.compute[i] + o.gather[zero][i]
        per_step[s] += o.sync[zero][i]
        mem[s] += o.memory[zero][i] + (M - 1) * o.activation[i]
    for e in problem.edges:
        a, b = stage_of_op[e.src], stage_of_op[e.dst]
        if a == b or e.cross_stage is None:
            per_micro[b] += e.cost[assign[e.src], assign[e.dst]]
        else:
            per_micro[b] += e.cross_stage[assign[e.src]]
    S = n_stages
    step = (M + S - 1) * float(per_micro.max()) + float(per_step.max())
    return PipelineCost(step, problem.base_memory + int(mem.max()), list(stage_of_op), per_micro.tolist(),
                        (S - 1) / (M + S - 1))


def best_cut(problem: OpProblem, assign: list[int], zero: int, n_stages: int) -> PipelineCost | None:
    """The contiguous cut into ``n_stages`` stages with the least slowest-stage time (None: too few layers)."""
    blocks = blocks_of(problem.ops)
    nb = len(blocks)
    if nb < n_stages:
        return None
    block_of = np.zeros(len(problem.ops), dtype=np.int64)
    w = np.zeros(nb)
    for b, ks in enumerate(blocks):
        for k in ks:
            block_of[k] = b
            i = assign[k]
            w[b] += problem.ops[k].compute[i] + problem.ops[k].gather[zero][i]
    extra = np.zeros(nb + 1)  # extra[c]: cost added to the stage starting at block c if a cut is there
    for e in problem.edges:
        if e.cross_stage is None:
            continue
        a, b = block_of[e.src], block_of[e.dst]
        inner = e.cost[assign[e.src], assign[e.dst]]
        if a == b:
            w[a] += inner
            continue
        w[b] += inner
        for c in range(a + 1, b + 1):  # a cut at any block boundary between them makes it a move
            extra[c] += e.cross_stage[assign[e.src]] - inner
    prefix = np.concatenate([[0.0], np.cumsum(w)])

    def stage(i: int, j: int) -> float:  # blocks i..j-1
        return prefix[j] - prefix[i] + (extra[i] if i > 0 else 0.0)

    inf = float("inf")
    f = np.full((n_stages + 1, nb + 1), inf)
    arg = np.zeros((n_stages + 1, nb + 1), dtype=np.int64)
    f[0][0] = 0.0
    for s in range(1, n_stages + 1):
        for j in range(s, nb + 1):
            for i in range(s - 1, j):
                v = max(f[s - 1][i], stage(i, j))
                if v < f[s][j]:
                    f[s][j], arg[s][j] = v, i
    cuts, j = [], nb
    for s in range(n_stages, 0, -1):
        i = int(arg[s][j])
        cuts.append((i, j))
        j = i
    stage_of_block = np.zeros(nb, dtype=np.int64)
    for s, (i, j) in enumerate(reversed(cuts)):
        stage_of_block[i:j] = s
    return price_stages(problem, assign, zero, [int(stage_of_block[b]) for b in block_of], n_stages)


def stage_prefixes(problem: OpProblem, stage_of_op: list[int]) -> dict[str, int]:
    """``Strategy.stage_of`` for a cut: each layer's module prefix and its stage."""
    out: dict[str, int] = {}
    for k, o in enumerate(problem.ops):
        if o.unit:
            out.setdefault(o.unit, stage_of_op[k])
    return out
