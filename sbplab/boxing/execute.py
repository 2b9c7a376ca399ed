"""Run boxing steps on the shards of all ranks held in one process, with each collective's real
semantics: all-gather concatenates the group's shards in group order, reduce-scatter reduces each
chunk across the group, all-to-all exchanges blocks, moves copy exactly the transferred regions.
Nothing here ever rebuilds the full tensor, so a wrong plan gives a wrong value instead of hiding.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..layout import local_block, local_shape, partial_fill, reduce_tensors, split_range
from ..sbp import B, Broadcast, Partial, fmt_sbp
from .step import BoxingStep


def _narrow(t: torch.Tensor, dim: int, n: int, parts: int, i: int) -> torch.Tensor:
    a, b = split_range(n, parts, i)
    return t.narrow(dim, a, b - a)


def _fill_op(state, axis: int, op: str, coords: tuple[int, ...]) -> str:
    """Whose identity fills the outside of my slice when ``state[axis]`` becomes ``P(op)``.

    Under a later ``P`` (sum) axis the outer identity must itself be split into addends: one rank of
    that inner axis holds it, the others hold 0. (For floats ``-inf + -inf`` happens to stay ``-inf``,
    but for integers ``iinfo.min + iinfo.min`` overflows.)
    """
    if op == "sum":
        return op
    for j in range(axis + 1, len(state)):
        if isinstance(state[j], Partial) and state[j].op == "sum" and coords[j] != 0:
            return "sum"
    return op


def run_axis_step(step: BoxingStep, shards: Mapping[int, torch.Tensor], shape: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Apply a one-mesh-axis step to every group of that axis."""
    axis = step.mesh_axis
    old, new = step.src_sbp[axis], step.dst_sbp[axis]
    pl = step.placement
    out: dict[int, torch.Tensor] = {}
    for group in pl.groups(axis):
        p = len(group)
        xs = [shards[r] for r in group]
        if step.kind == "slice":
            for i, r in enumerate(group):
                out[r] = _narrow(xs[i], new.dim, xs[i].shape[new.dim], p, i).clone()
        elif step.kind == "zero":
            for i, r in enumerate(group):
                if isinstance(old, Broadcast):
                    keep = new.op != "sum" or i == 0
                    out[r] = xs[i].clone() if keep else partial_fill(new.op, xs[i])
                else:  # S(d) -> P: my slice inside the identity of the reduce op
                    whole = step.src_sbp[:axis] + (B,) + step.src_sbp[axis + 1:]
                    piece = local_shape(shape, pl, whole, r)
                    buf = partial_fill(_fill_op(step.src_sbp, axis, new.op, pl.coords(r)), xs[i].new_empty(piece))
                    _narrow(buf, old.dim, piece[old.dim], p, i).copy_(xs[i])
                    out[r] = buf
        elif step.kind == "all_gather":
            full = torch.cat(xs, dim=old.dim)
            for r in group:
                out[r] = full.clone()
        elif step.kind == "all_reduce":
            total = reduce_tensors(old.op, xs)
            for r in group:
                out[r] = total.clone()
        elif step.kind == "reduce_scatter":
            n = xs[0].shape[new.dim]
            for i, r in enumerate(group):
                out[r] = reduce_tensors(old.op, [_narrow(x, new.dim, n, p, i) for x in xs])
        elif step.kind == "all_to_all":
            n = xs[0].shape[new.dim]
            for j, r in enumerate(group):  # rank j receives block j of every sender, in sender order
                out[r] = torch.cat([_narrow(x, new.dim, n, p, j) for x in xs], dim=old.dim)
        else:
            raise ValueError(f"{step.kind} is not a one-axis step")
    return out


def run_move(step: BoxingStep, shards: Mapping[int, torch.Tensor], shape: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Each destination rank assembles its shard from exactly the regions sent to it."""
    src_pl, dst_pl = step.src_placement, step.placement
    src_sbp, dst_sbp = step.src_sbp, step.dst_sbp
    device = torch.device(dst_pl.device_type)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"this plan moves shards to {dst_pl}, but this process has no CUDA device")
    like = next(iter(shards.values()))
    out: dict[int, torch.Tensor] = {}
    filled: dict[int, int] = {}
    for r in dst_pl.rank_list:
        out[r] = torch.empty(local_shape(shape, dst_pl, dst_sbp, r), dtype=like.dtype, device=device)
        filled[r] = 0
    partial = any(isinstance(x, Partial) for x in src_sbp)
    for t in step.transfers:
        src_block = local_block(shape, src_pl, src_sbp, t.src_rank)
        dst_block = local_block(shape, dst_pl, dst_sbp, t.dst_rank)
        take = tuple(slice(s - o, e - o) for (s, e), (o, _) in zip(t.block, src_block))
        put = tuple(slice(s - o, e - o) for (s, e), (o, _) in zip(t.block, dst_block))
        if partial and src_block != dst_block:
            raise RuntimeError("a partial shard can only move whole, to the same block")
        out[t.dst_rank][put] = shards[t.src_rank][take].to(device)
        filled[t.dst_rank] += t.numel
    for r, n in filled.items():
        if n != out[r].numel():
            raise RuntimeError(f"move into rank {r} wrote {n} of {out[r].numel()} elements; the transfers "
                               f"do not tile its block")
    return out


def check_shards(shards: Mapping[int, torch.Tensor], placement, shape, nd_sbp) -> None:
    """The shards a plan is run on must be exactly the placement's ranks, with the expected local shapes."""
    if set(shards) != set(placement.rank_list):
        raise ValueError(f"plan.run needs one shard per rank of {placement}: ranks {sorted(placement.rank_list)}, "
                         f"got ranks {sorted(shards)}")
    for r in placement.rank_list:
        want = local_shape(shape, placement, nd_sbp, r)
        if tuple(shards[r].shape) != want:
            raise ValueError(f"plan.run: rank {r}'s shard has shape {tuple(shards[r].shape)} but "
                             f"{tuple(shape)} under SBP {fmt_sbp(nd_sbp)} on {placement} gives it {want}")

