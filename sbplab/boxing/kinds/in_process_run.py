"""A boxing step run for every rank held in one process, through the same kind code the workers run.

Each member of a group gets the ``Collective`` actor lowering would give it and posts it with the
kind's ``start`` on its ``InProcessCommunicator``; a move's source ranks post ``take_block -> Send``
per transfer and its destinations ``Recv`` plus ``put_blocks``, exactly the actors of
``compiler/lowering/to_actors.py``. Every rank posts before any waits (a sequential exchange), so no
thread is needed; the in-process world moves the tensors between the ranks' buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ...layout import local_block, local_shape

if TYPE_CHECKING:
    from ..step import BoxingStep
    from .kind_base import Pending, StepKind


def _world(world: Any, ranks, groups=(), pairs=()) -> Any:
    """``world`` (an ``InProcessWorld`` holding ``ranks``), or a fresh one; the groups ensured on it."""
    from ...runtime.communicators import InProcessWorld

    if world is None:
        world = InProcessWorld(ranks)
    world.communicator(min(ranks)).ensure_groups(groups, pairs)
    return world


def run_collective(kind: StepKind, step: BoxingStep, shards: Mapping[int, torch.Tensor], shape: tuple[int, ...],
                   world: Any = None) -> dict[int, torch.Tensor]:
    """Every member of every group of the step's mesh axis posts the kind's collective, then waits."""
    from ...runtime.specs import Collective

    groups = [tuple(g) for g in step.placement.groups(step.mesh_axis)]
    world = _world(world, step.placement.rank_list, groups)
    pend: dict[int, Pending] = {}
    for g in groups:
        for r in g:
            attrs = kind.collective_attrs(step, g, tuple(shards[r].shape), shape)
            actor = Collective(f"{kind.name}@{r}", kind_=kind.name, group=g, inputs=("x",),
                               mesh_axis=step.mesh_axis, **attrs)
            pend[r] = kind.start(world.communicator(r), actor, shards[r])
    return {r: p.wait() for r, p in pend.items()}  # type: ignore[misc]


def run_move(kind: StepKind, step: BoxingStep, shards: Mapping[int, torch.Tensor], shape: tuple[int, ...],
             device: torch.device, world: Any = None) -> dict[int, torch.Tensor]:
    """Sources post a Send per transfer that leaves them, destinations a Recv per transfer that arrives,
    matched by tag (the transfer's index); each destination then puts its regions together."""
    from ...runtime.specs import Recv, Send

    src_pl, dst_pl = step.src_placement, step.placement
    ranks = sorted(set(src_pl.rank_list) | set(dst_pl.rank_list))
    pairs = sorted({(min(t.src_rank, t.dst_rank), max(t.src_rank, t.dst_rank)) for t in step.transfers
                    if t.src_rank != t.dst_rank})
    world = _world(world, ranks, pairs=pairs)
    like = next(iter(shards.values()))
    sends: list[Pending] = []
    for j, t in enumerate(step.transfers):
        if t.src_rank != t.dst_rank:
            src_block = local_block(shape, src_pl, step.src_sbp, t.src_rank)
            fn, attrs = kind.take_kernel(t.block, src_block)
            a = Send(f"send{j}", inputs=("x",), peer=t.dst_rank, tag=j)
            sends.append(kind.start(world.communicator(t.src_rank), a, fn([shards[t.src_rank]], attrs)[0], tag=j))
    parts: dict[int, list[tuple[Any, Any, Any]]] = {r: [] for r in dst_pl.rank_list}  # (input, take, put)
    for j, t in enumerate(step.transfers):
        dst_block = local_block(shape, dst_pl, step.dst_sbp, t.dst_rank)
        put = tuple((s - o, e - o) for (s, e), (o, _) in zip(t.block, dst_block))
        if t.src_rank == t.dst_rank:
            src_block = local_block(shape, src_pl, step.src_sbp, t.src_rank)
            take = tuple((s - o, e - o) for (s, e), (o, _) in zip(t.block, src_block))
            parts[t.dst_rank].append((shards[t.src_rank], take, put))
        else:
            a = Recv(f"recv{j}", peer=t.src_rank, tag=j, shape=tuple(e - s for s, e in t.block), dtype=like.dtype)
            parts[t.dst_rank].append((kind.start(world.communicator(t.dst_rank), a, None, tag=j), None, put))
    for p in sends:
        p.wait()
    out = {}
    for r, ps in parts.items():
        mine = local_shape(shape, dst_pl, step.dst_sbp, r)
        if not ps:  # an empty block: nothing arrives
            out[r] = torch.empty(mine, dtype=like.dtype, device=device)
            continue
        inputs = [x if isinstance(x, torch.Tensor) else x.wait() for x, _, _ in ps]
        fn, attrs = kind.put_kernel(mine, [tk for _, tk, _ in ps], [pt for _, _, pt in ps])
        out[r] = fn(inputs, attrs)[0].to(device)
    return out
