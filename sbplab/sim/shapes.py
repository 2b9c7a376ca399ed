"""Local shapes of every register of a plan, without running it: what the cost model needs to key
measured op times and to count bytes.

An ActorPlan names ops and local attributes but not tensor shapes, so they are propagated through
each rank's actors in dependency order: a Source's shard comes from the batch shape (cut into
micro-batches along ``micro_dim``, then sharded by its SBP), a State's from its initial tensor, a
Recv's from its spec, a collective's from its kind and sizes, a registry op's from the registry's
``infer`` (attributes are already local), and a plain kernel's from running it on meta tensors.
Uneven micro-batches take the first (largest) micro-batch's shape for every firing.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..freeze import freeze
from ..layout import balanced_sizes, local_shape
from ..ops.registry import REGISTRY, RNG_ATTRS, TensorMeta
from ..runtime.specs import Accumulate, Actor, Collective, Compute, Recv, Send, Sink, Source, State
from .sim_errors import SimulationError

Shape = tuple[int, ...]
_ITEMSIZE: dict[torch.dtype, int] = {}


def nbytes(m: TensorMeta) -> int:
    """``m.nbytes`` without making a tensor each time (it is asked for every register)."""
    size = _ITEMSIZE.get(m.dtype)
    if size is None:
        size = _ITEMSIZE[m.dtype] = torch.empty((), dtype=m.dtype).element_size()
    return m.numel * size


def hashable_attrs(attrs: object) -> object:
    """``attrs`` frozen (``sbplab.freeze``), or None when some value cannot be hashed (a tensor), which
    only turns a cache off. A dict whose values hash already is not walked (``freeze_attrs``: the same key,
    asked for every actor of every rank simulated)."""
    if isinstance(attrs, dict):
        items = tuple(sorted(attrs.items()))
        try:
            hash(items)
            return items
        except TypeError:
            pass
    key = freeze(attrs)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _cost_attrs(attrs: object) -> object:
    """``attrs`` less ``RNG_ATTRS`` (a random op's stream and draw: no bearing on its shapes or its cost, but
    different on every op and rank), so ranks and layers share one shape inference and one cost."""
    if isinstance(attrs, dict) and any(k in attrs for k in RNG_ATTRS):
        return {k: v for k, v in attrs.items() if k not in RNG_ATTRS}
    return attrs


@dataclass(frozen=True)
class ActorShapes:
    """Local input and output metas of one actor on one rank, and its attributes made hashable (None
    when they cannot be), so ranks running the same op on the same shapes share one cost."""

    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    attrs: object = ()


def batch_shapes(feeds: Mapping[str, object] | None) -> dict[str, TensorMeta]:
    """Feed name -> global shape and dtype of one step's batch, from tensors or shapes."""
    out: dict[str, TensorMeta] = {}
    for name, v in (feeds or {}).items():
        if isinstance(v, torch.Tensor):
            out[name] = TensorMeta(tuple(v.shape), v.dtype)
        elif isinstance(v, TensorMeta):
            out[name] = v
        else:
            try:
                out[name] = TensorMeta(tuple(int(d) for d in v))  # type: ignore[union-attr]
            except TypeError:
                raise SimulationError(f"feeds[{name!r}] must be a tensor or a shape, got {type(v).__name__}") \
                    from None
    return out


def _source_meta(a: Source, rank: int, micro: int, batch: dict[str, TensorMeta]) -> TensorMeta:
    if a.feed not in batch:
        raise SimulationError(f"source {a.name!r} on rank {rank} reads feed {a.feed!r}; pass its batch shape as "
                              f"feeds={{{a.feed!r}: shape or tensor}} (known feeds: {sorted(batch)})")
    m = batch[a.feed]
    shape = list(m.shape)
    if a.scope == "micro":
        if a.micro_dim >= len(shape) or shape[a.micro_dim] < micro:
            raise SimulationError(f"source {a.name!r}: feed {a.feed!r} of shape {tuple(shape)} cannot be cut into "
                                  f"{micro} micro-batches along dim {a.micro_dim}")
        shape[a.micro_dim] = balanced_sizes(shape[a.micro_dim], micro)[0]
    return TensorMeta(local_shape(tuple(shape), a.placement, a.sbp, rank), m.dtype)  # type: ignore[arg-type]


def kernel_of(op: str):
    if ":" in op:
        mod, fn = op.split(":", 1)
        return getattr(importlib.import_module(mod), fn)
    return REGISTRY[op].kernel


def _run_on_meta(a: Compute, ins: tuple[TensorMeta, ...]) -> tuple[TensorMeta, ...]:
    """Output metas of a kernel: run it on meta tensors (no data), else on zeros if it reads values."""
    try:
        kernel = kernel_of(a.op)
    except (ImportError, AttributeError, KeyError, ValueError) as e:
        raise SimulationError(f"compute actor {a.name!r}: op {a.op!r} is neither a registry op nor an "
                              f"importable 'module:function' kernel ({e})") from None
    errors = []
    for device in ("meta", "cpu"):
        xs = [torch.zeros(m.shape, dtype=m.dtype, device=device) for m in ins]
        try:
            outs = kernel(xs, dict(a.attrs))
            return tuple(TensorMeta(tuple(o.shape), o.dtype) for o in outs)[: a.outputs]
        except Exception as e:  # noqa: BLE001 - any failure means: cannot tell its shapes
            errors.append(f"{device}: {type(e).__name__}: {e}")
    raise SimulationError(f"compute actor {a.name!r} ({a.op}): cannot tell its output shapes from inputs "
                          f"{[m.shape for m in ins]}; running it failed ({'; '.join(errors)})")


def _compute_metas(a: Compute, ins: tuple[TensorMeta, ...], fa: object, cache: dict) -> tuple[TensorMeta, ...]:
    key = (a.op, ins, fa, a.outputs) if fa is not None or not a.attrs else None
    if key is not None and key in cache:
        return cache[key]
    out = _compute_metas_uncached(a, ins)
    if key is not None:
        cache[key] = out
    return out


def _compute_metas_uncached(a: Compute, ins: tuple[TensorMeta, ...]) -> tuple[TensorMeta, ...]:
    opdef = REGISTRY.get(a.op)
    if opdef is not None:
        try:
            return tuple(opdef.infer(list(ins), dict(a.attrs)))[: a.outputs]
        except Exception:  # noqa: BLE001 - fall back to running the kernel on meta tensors
            pass
    return _run_on_meta(a, ins)


def infer_rank_shapes(actors: list[Actor], rank: int, micro: int, batch: dict[str, TensorMeta],
                      cache: dict | None = None) -> dict[str, ActorShapes]:
    """Actor name -> its local metas on ``rank``; actors in any order (inputs resolved on demand).
    ``cache``: shared by the ranks of one plan, which mostly run the same ops on same-shaped shards."""
    cache = {} if cache is None else cache
    by_name = {a.name: a for a in actors}
    done: dict[str, ActorShapes] = {}
    for first in actors:  # depth first with an explicit stack: chains of thousands of actors are normal
        if first.name in done:
            continue
        try:  # lowering lists a rank's actors in dependency order: most find their inputs done
            ins = tuple([done[r.actor].outputs[r.index] for r in first.inputs])
        except KeyError:
            pass
        else:
            done[first.name] = _shapes(first, rank, micro, batch, ins, cache)
            continue
        stack, entered = [first], set()
        while stack:
            a = stack[-1]
            if a.name in done:
                stack.pop()
                continue
            missing = [by_name[r.actor] for r in a.inputs if r.actor not in done]
            if missing:
                if a.name in entered:
                    raise SimulationError(f"rank {rank}: actor {a.name!r} reads its own output through a cycle; "
                                          f"only a State's update may close a loop")
                entered.add(a.name)
                stack.extend(missing)
                continue
            ins = tuple(done[r.actor].outputs[r.index] for r in a.inputs)
            done[a.name] = _shapes(a, rank, micro, batch, ins, cache)
            stack.pop()
    return done


def _shapes(a: Actor, rank: int, micro: int, batch: dict[str, TensorMeta], ins: tuple[TensorMeta, ...],
            cache: dict) -> ActorShapes:
    """``a``'s metas on ``rank`` once its inputs' are known."""
    fa = hashable_attrs(_cost_attrs(a.attrs)) if isinstance(a, Compute) else ()
    return ActorShapes(ins, _outputs(a, rank, micro, batch, ins, fa, cache), fa)


def _outputs(a: Actor, rank: int, micro: int, batch: dict[str, TensorMeta],
             ins: tuple[TensorMeta, ...], fa: object, cache: dict) -> tuple[TensorMeta, ...]:
    if isinstance(a, Source):
        return (_source_meta(a, rank, micro, batch),)
    if isinstance(a, State):
        return (TensorMeta(tuple(a.init.shape), a.init.dtype),)  # type: ignore[union-attr]
    if isinstance(a, Recv):
        return (TensorMeta(a.shape, a.dtype),)
    if isinstance(a, Collective):
        from .comm_time import collective_output  # noqa: PLC0415 - comm_time imports this module

        return (collective_output(a, rank, ins[0]),)
    if isinstance(a, Accumulate):
        return ins
    if isinstance(a, (Send, Sink)):
        return ()
    if isinstance(a, Compute):
        outs = _compute_metas(a, ins, fa, cache)
        if len(outs) < a.outputs:
            raise SimulationError(f"compute actor {a.name!r} ({a.op}) declares {a.outputs} outputs but its "
                                  f"kernel makes {len(outs)}")
        return outs
    raise SimulationError(f"rank {rank}: actor {a.name!r} is a {type(a).__name__}, which the simulator cannot "
                          f"model (known: Source, State, Compute, Accumulate, Collective, Send, Recv, Sink)")


_OWN = (Source, Recv, Collective)  # their outputs follow the rank's own shard, peer or place in its group


def _same_work(a: Actor, b: Actor) -> bool:
    """Whether ``a``, reading what ``b`` reads, makes what ``b`` makes (actors of one type, not ``_OWN``)."""
    if isinstance(a, Compute):
        if a.op != b.op or a.outputs != b.outputs:  # type: ignore[attr-defined]
            return False
        try:
            return bool(a.attrs is b.attrs or a.attrs == b.attrs)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a tensor among them: inferred on its own
            return False
    if isinstance(a, State):
        return tuple(a.init.shape) == tuple(b.init.shape) and a.init.dtype == b.init.dtype  # type: ignore[union-attr,attr-defined]
    return isinstance(a, (Accumulate, Send, Sink))


def infer_like(actors: list[Actor], like: list[Actor], like_shapes: dict[str, ActorShapes], rank: int, micro: int,
               batch: dict[str, TensorMeta], cache: dict | None = None) -> dict[str, ActorShapes]:
    """``infer_rank_shapes`` of a rank whose actors line up with those of ``like`` (whose shapes are
    ``like_shapes``), position by position, as ranks of one plan mostly do: but for names, the attributes that
    say where a piece lies, their own communication and shards. An actor of the same type, op and attributes as its
    counterpart, reading the same metas, makes the same: it shares its ``ActorShapes``; the rest (sources,
    receives, collectives, what reads other metas) are inferred. Why: the simulator infers one rank per alike
    group, and the groups of one plan differ in a few actors. Lists that do not line up, or a cycle:
    ``infer_rank_shapes``."""
    if len(actors) != len(like):
        return infer_rank_shapes(actors, rank, micro, batch, cache)
    cache = {} if cache is None else cache
    done: dict[str, ActorShapes] = {}
    todo = list(zip(actors, like))
    while todo:  # in order; what reads a later actor (a bucket's unpack) waits for the next pass
        later = []
        for a, b in todo:
            try:
                ins = tuple([done[r.actor].outputs[r.index] for r in a.inputs])
            except KeyError:
                later.append((a, b))
                continue
            sb = like_shapes[b.name]
            if type(a) is type(b) and not isinstance(a, _OWN) and ins == sb.inputs and _same_work(a, b):
                done[a.name] = sb
                continue
            done[a.name] = _shapes(a, rank, micro, batch, ins, cache)
        if len(later) == len(todo):  # no progress: a cycle or an unknown name, which the ordinary walk names
            return infer_rank_shapes(actors, rank, micro, batch, cache)
        todo = later
    return done
