"""Checkpoints of a compiled step's training state: the driver's side of ``cluster.save`` / ``cluster.load``.

A checkpoint is a torch.distributed.checkpoint (DCP) folder: ``.metadata`` and one ``__<rank>_0.distcp``
file per rank that wrote something. Its names are the logical ones (``result.params``' keys): a
module's parameter names, ``"<param>.momentum_buffer"``, ``"<param>.exp_avg"``, ``"adam.step"``..., and
``"sbplab.steps"``, the training steps done. Each worker writes and reads its own blocks
(``checkpoint_worker``), so a checkpoint saved under one strategy loads under another, and a plain
torch module reads it without any process group:

    torch.distributed.checkpoint.load(model.state_dict(), checkpoint_id=path,
                                      planner=DefaultLoadPlanner(allow_partial_load=True))

or ``load_checkpoint(model, path)`` here (``read_checkpoint(path)`` for every tensor, optimizer state
included). Loading checks names and shapes on the driver first, so a checkpoint that does not fit is
refused before any worker is asked to read it.
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from collections.abc import Mapping
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch

from ..errors import ClusterError, InputError, InputTypeError
from ..layout import local_block, split_range
from ..sbp import Broadcast, Split
from .actor_plan import ActorPlan
from .checkpoint_blocks import STEPS_KEY, Piece, ShardBlock
from .checkpoint_worker import CheckpointRequest
from .specs import State, Zeros
from .wire import recv, send


def checkpoint_path(path: Any, what: str) -> Path:
    """``path`` as an absolute folder (the workers may not share the driver's working directory)."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"{what}: the checkpoint path must be a str or a path (a folder), got {path!r}")
    p = Path(path).expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise InputError(f"{what}: {str(p)!r} is a file; a checkpoint is a folder (DCP writes one file per rank "
                         f"and a .metadata there)")
    return p


def _global_size(key: str, placement: Any, sbp: tuple, local: Mapping[int, tuple[int, ...]]) -> tuple[int, ...]:
    """The logical shape of ``key`` from its ranks' local shapes: along each dim, the ranks at coordinate
    0 of every mesh axis that does not split that dim hold each piece of it exactly once."""
    ndim = len(next(iter(local.values())))
    size = []
    for d in range(ndim):
        keep = [a for a, x in enumerate(sbp) if not (isinstance(x, Split) and x.dim == d)]
        size.append(sum(shape[d] for r, shape in local.items()
                        if all(placement.coords(r)[a] == 0 for a in keep)))
    return tuple(size)


def blocks_of(plan: ActorPlan) -> dict[int, list[ShardBlock]]:
    """Per rank, where each keyed State's value lies in its logical tensor (``ShardBlock``)."""
    layout: dict[str, tuple[Any, tuple, dict[int, State]]] = {}  # key -> placement, sbp, rank -> State
    states: list[tuple[int, State]] = []
    for r, rp in plan.ranks.items():
        for a in rp.actors:
            if not isinstance(a, State) or not a.key:
                continue
            if a.placement is None:
                raise ClusterError(f"cannot checkpoint {plan.name!r}: State {a.name!r} ({a.key!r}) on rank {r} "
                                   f"has no placement, so where its value lies in {a.key!r} is unknown")
            bad = [x for x in a.sbp if not isinstance(x, (Broadcast, Split))]
            if bad:
                raise ClusterError(f"cannot checkpoint {plan.name!r}: State {a.key!r} on rank {r} is partial "
                                   f"({bad[0]}); only split (S) and replicated (B) state is stored")
            states.append((r, a))
            got = layout.setdefault(a.key, (a.placement, tuple(a.sbp), {}))
            if got[0] == a.placement and got[1] == tuple(a.sbp):
                got[2][r] = a
    sizes = {k: _global_size(k, pl, sbp, {r: tuple(a.init.shape) for r, a in by.items()})  # type: ignore[union-attr]
             for k, (pl, sbp, by) in layout.items()}
    out: dict[int, list[ShardBlock]] = {r: [] for r in plan.ranks}
    for r, a in states:
        size = sizes[a.key]
        blk = local_block(size, a.placement, tuple(a.sbp), r)  # type: ignore[arg-type]
        shape = tuple(e - s for s, e in blk)
        if shape != tuple(a.init.shape):  # type: ignore[union-attr]
            raise ClusterError(f"cannot checkpoint {plan.name!r}: State {a.key!r} on rank {r} holds "
                               f"{tuple(a.init.shape)}, but a block of {size} under {a.sbp} is {shape}")  # type: ignore
        first = layout[a.key]
        write = first[0] == a.placement and first[1] == tuple(a.sbp)
        out[r].append(ShardBlock(a.name, a.key, size, tuple(s for s, _ in blk), shape, a.init.dtype, write,  # type: ignore
                                 _strided_pieces(size, a.placement, tuple(a.sbp), r, blk)))
    return out


def _strided_pieces(size: tuple[int, ...], placement: Any, sbp: tuple, rank: int,
                    blk: tuple[tuple[int, int], ...]) -> tuple[Piece, ...]:
    """The blocks of the logical tensor a rank's value under a strided split is made of (none for any
    other layout: its value is the one block ``blk``).

    Under ``S(d, chunks=k)`` on an axis of n places, dim d is k chunks of c = size[d] / k and place i
    holds ``[a, b)`` of each (its balanced piece of c), end to end: block j is ``[j*c + a, j*c + b)`` of
    the logical tensor and ``[j*(b-a), (j+1)*(b-a))`` of the local value. A strided split is the only
    split of its dim (``layout``), so other dims keep their one range from ``blk``."""
    per_dim: dict[int, list[tuple[int, int, int]]] = {}  # dim -> (logical start, local start, length)
    coords = placement.coords(rank)
    for axis, x in enumerate(sbp):
        if isinstance(x, Split) and x.chunks > 1:
            c = size[x.dim] // x.chunks
            a, b = split_range(c, placement.shape[axis], coords[axis])
            per_dim[x.dim] = [(j * c + a, j * (b - a), b - a) for j in range(x.chunks)]
    if not per_dim:
        return ()
    ranges = [per_dim.get(d, [(s, 0, e - s)]) for d, (s, e) in enumerate(blk)]
    return tuple(Piece(tuple(r[0] for r in combo), tuple(r[1] for r in combo), tuple(r[2] for r in combo))
                 for combo in itertools.product(*ranges))


def initial_values(plan: ActorPlan) -> dict[int, dict[str, torch.Tensor]]:
    """Every keyed State's ``init`` as a tensor: what a step that has not run yet would save."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for r, rp in plan.ranks.items():
        out[r] = {}
        for a in rp.actors:
            if isinstance(a, State) and a.key:
                init = a.init
                out[r][a.name] = torch.zeros(init.shape, dtype=init.dtype) if isinstance(init, Zeros) else init
    return out


def check_fits(path: Path, blocks: Mapping[int, list[ShardBlock]], what: str) -> None:
    """Refuse, before any worker reads, a checkpoint that lacks a name the step needs or has another shape."""
    if not (path / ".metadata").is_file():
        raise InputError(f"{what}: no checkpoint at {str(path)!r} (no .metadata file there); give a folder "
                         f"written by cluster.save or run(..., checkpoint_dir=...)")
    from .checkpoint_dcp import stored_keys  # torch.distributed.checkpoint: loaded when used

    have = stored_keys(path)
    need = {b.key: b.size for bs in blocks.values() for b in bs}
    missing = sorted(k for k in need if k not in have)
    if missing:
        opt = [k for k in missing if "." in k and k.rsplit(".", 1)[0] in have]
        hint = " (optimizer state: was it saved with another optimizer?)" if opt else ""
        raise ClusterError(f"{what}: the checkpoint at {str(path)!r} has no {missing[:5]}"
                           f"{' and more' if len(missing) > 5 else ''}{hint}; it holds {sorted(have)[:8]}...")
    for k, size in need.items():
        if have[k][0] != size:
            raise ClusterError(f"{what}: {k!r} is {have[k][0]} in the checkpoint at {str(path)!r} but {size} in "
                               f"this step; a checkpoint loads into a model of the same shapes")


def exchange(driver: Any, requests: Mapping[int, CheckpointRequest], timeout: float, what: str) -> dict[int, Any]:
    """Send each worker its request and gather every reply. A worker error is reported with its traceback
    (the workers stay up: DCP ends the call on every rank); a worker that dies or does not answer within
    ``timeout`` leaves the driver unhealthy, so the next run starts fresh workers."""
    driver._busy = True  # the replies are ours, not signs of a dead worker
    try:
        for r, conn in driver.conns.items():
            send(conn, ("checkpoint", requests[r]))
        by_conn = {c: r for r, c in driver.conns.items()}
        by_sentinel = {p.sentinel: r for r, p in enumerate(driver.procs) if p.sentinel is not None}
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < len(by_conn):
            left = deadline - time.monotonic()
            if left <= 0:
                driver.healthy = False
                late = sorted(set(by_conn.values()) - set(replies))
                raise ClusterError(f"{what}: ranks {late} did not finish within {timeout:.0f} s; the workers are "
                                   f"restarted on the next run")
            for obj in wait(list(by_conn) + list(by_sentinel), timeout=min(left, 0.2)):
                r = by_sentinel.get(obj, by_conn.get(obj))
                try:
                    msg = recv(obj) if obj in by_conn else None
                except (EOFError, OSError):
                    msg = None
                if msg is None:
                    driver.healthy = False
                    raise ClusterError(f"{what}: worker rank {r} died; the workers are restarted on the next run")
                if msg[0] in ("checkpoint", "checkpoint_error"):
                    replies[r] = msg
    except BaseException:
        driver.healthy = False
        raise
    finally:
        driver._busy = False
    failed = sorted(r for r, m in replies.items() if m[0] == "checkpoint_error")
    if failed:
        tb = replies[failed[0]][2].rstrip()
        raise ClusterError(f"{what} failed on ranks {failed}: {tb.splitlines()[-1]}\n\n--- original traceback "
                           f"(rank {failed[0]}) ---\n{tb}")
    return {r: m[2] for r, m in replies.items()}


def read_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every logical tensor of a checkpoint, whole, read here without any process group: parameters under
    the module's names, optimizer state under ``"<param>.<state>"``, and ``"sbplab.steps"``."""
    p = checkpoint_path(path, "read_checkpoint")
    if not (p / ".metadata").is_file():
        raise InputError(f"read_checkpoint: no checkpoint at {str(p)!r} (no .metadata file there)")
    from torch.distributed.checkpoint import load as dcp_load

    from .checkpoint_dcp import stored_keys

    state = {k: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in stored_keys(p).items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(state, checkpoint_id=os.fspath(p), no_dist=True)
    return state


def load_checkpoint(module: torch.nn.Module, path: str | os.PathLike, strict: bool = True) -> list[str]:
    """Copy a checkpoint's parameters into a plain torch module (as ``RunResult.load_into`` does with a
    run's); returns the names loaded. strict: every trainable parameter must be in the checkpoint."""
    from .results import RunResult

    state = read_checkpoint(path)
    state.pop(STEPS_KEY, None)
    return RunResult(params=state).load_into(module, strict=strict)
