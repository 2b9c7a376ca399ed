"""Driver-side data handling: cut global batches into per-rank shards, assemble what comes back."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InputError, InputTypeError
from ..layout import assemble, balanced_sizes, shard
from ..sbp import Broadcast, Split
from .actor_plan import ActorPlan
from .memory_peak import MemoryPeak
from .specs import PlanError, Sink, Source, State
from .trace import Trace

Batches = Mapping[str, torch.Tensor] | Sequence[Mapping[str, torch.Tensor]] | Callable[[int], Mapping]


def batch_of(batches: Batches | None, step: int, steps: int) -> Mapping[str, torch.Tensor]:
    if batches is None:
        return {}
    if callable(batches):
        return batches(step)
    if isinstance(batches, Mapping):
        return batches
    if len(batches) < steps:
        raise PlanError(f"batches has {len(batches)} entries for {steps} steps; give one per step, "
                        f"one mapping for every step, or a function of the step")
    return batches[step]


def cut_feeds(plan: ActorPlan, batches: Batches | None,
              steps: int) -> dict[int, dict[str, list[torch.Tensor]]]:
    """Per rank, per feed: the local shard of every firing (step-major, then micro-batch)."""
    M = plan.micro_batches
    cache: dict[tuple, dict[int, torch.Tensor]] = {}
    out: dict[int, dict[str, list[torch.Tensor]]] = {r: {} for r in plan.ranks}
    per_step = [batch_of(batches, s, steps) for s in range(steps)] if any(
        isinstance(a, Source) for rp in plan.ranks.values() for a in rp.actors) else []
    for r, rp in plan.ranks.items():
        for a in rp.actors:
            if not isinstance(a, Source):
                continue
            pieces = []
            for s in range(steps):
                if a.feed not in per_step[s]:
                    raise PlanError(f"source {a.name!r} on rank {r} reads feed {a.feed!r}, but the batch "
                                    f"of step {s} has only {sorted(per_step[s])}")
                full = per_step[s][a.feed]
                micros = range(M) if a.scope == "micro" else [None]
                for m in micros:
                    # keyed by the tensor, not the step: a batch given once for every step is cut once,
                    # and the run ships one copy of each shard (pickle sends a repeated object once)
                    key = (a.feed, id(full), m, a.placement, a.sbp, a.micro_dim)
                    if key not in cache:
                        piece = full
                        if m is not None:
                            n = full.shape[a.micro_dim]
                            if n < M:
                                raise PlanError(f"feed {a.feed!r}: dim {a.micro_dim} has {n} rows, fewer "
                                                f"than {M} micro-batches")
                            sizes = balanced_sizes(n, M)
                            piece = full.narrow(a.micro_dim, sum(sizes[:m]), sizes[m])
                        cache[key] = shard(piece, a.placement, a.sbp, what=f"feed {a.feed!r}")  # type: ignore
                    pieces.append(cache[key][r])
            out[r][a.feed] = pieces
    return out


def stack_values(values: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """A sink's values as one tensor when they share a shape and dtype (a loss per step), else as they are.

    A run ships every rank's sink values to the driver, which unpickles them one rank after another.
    A tensor costs tens of microseconds to pickle and unpickle whatever its size, so hundreds of scalar
    losses sent one by one would add a visible share to every step of a short-step run."""
    if len(values) < 2:
        return values
    first = values[0]
    if any(v.shape != first.shape or v.dtype != first.dtype or v.device != first.device for v in values):
        return values
    return torch.stack(values)


def unstack_values(got: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    """``stack_values`` undone: one tensor per firing."""
    return list(got.unbind()) if isinstance(got, torch.Tensor) else got


@dataclass
class RunResult:
    """What a run gives back.

    losses: per step, the "loss" sink's global value as a float (micro-batches combined).
    outputs: per sink key, per step, the global value (a tensor).
    params: per State key, the final global value: a GlobalTensor (``.full()`` for the tensor). The
        keys are the graph's tensor names: a compiled step's parameters under their module names
        (``"blocks.0.fc1.weight"``), optimizer state under ``"<param>.<state>"`` (``".momentum_buffer"``,
        ``".exp_avg"``, ...). ``load_into(module)`` copies the parameters into a torch module.
    trace: every firing on one clock (``trace.to_chrome(path)``).
    step_times: measured wall seconds per step, from the trace (see the property).
    final_shards: per rank, per State actor, its final local value: what the next run of the same
        compiled step on the same cluster starts from (kept even with ``params=False``).
    memory: per rank, its measured peak (``MemoryPeak``: bytes by the simulator's categories; on CPU the
        tensors the runtime holds, on CUDA the allocator's peak): ``sl.compare`` sets it beside the prediction.
    """

    losses: list[float] = field(default_factory=list)
    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    trace: Trace = field(default_factory=Trace)
    steps: int = 0
    wall_s: float = 0.0
    final_shards: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False, compare=False)
    memory: dict[int, MemoryPeak] = field(default_factory=dict, repr=False, compare=False)

    @property
    def step_times(self) -> list[float]:
        """Wall seconds per step, read off the trace: step s lasts from the end of step s - 1 (the
        first step: from the first firing) to the end of its own last firing on any rank. Steps
        overlap a little in a pipelined run, so this is what each step adds to the run, the figure a
        simulator's steady-state step time predicts. Empty without a trace."""
        ends: dict[int, float] = {}
        for e in self.trace.events:
            if (not self.steps or e.step < self.steps) and e.end > ends.get(e.step, float("-inf")):
                ends[e.step] = e.end
        if not ends:
            return []
        prev = min(e.start for e in self.trace.events)
        out = []
        for s in range(max(ends) + 1):
            end = max(ends.get(s, prev), prev)
            out.append((end - prev) / 1e6)
            prev = end
        return out

    def full_params(self) -> dict[str, torch.Tensor]:
        return {k: (v.full() if hasattr(v, "full") else v) for k, v in self.params.items()}

    def load_into(self, module: torch.nn.Module, strict: bool = True) -> list[str]:
        """Copy the trained parameters into ``module`` (the torch module the step was compiled from,
        or one of the same structure), in place; returns the names it loaded.

        Each global value is assembled from the ranks' shards and copied into the module parameter of
        the same name (a tied parameter under any of its names), and into a buffer of the same name
        where the step updates one (BatchNorm's running statistics). strict: every trainable parameter
        of the module must get a value; a frozen one (``requires_grad=False``) was a constant of the
        step and is left as it is. Optimizer state is not a module parameter and is not loaded.
        """
        if not isinstance(module, torch.nn.Module):
            raise InputTypeError(f"load_into needs a torch.nn.Module, got {type(module).__name__}")
        if not self.params:
            raise InputError("this result has no parameters: it was run with params=False (or its plan has "
                             "no keyed State); run with params=True to get them")
        done: set[int] = set()
        loaded: list[str] = []
        with torch.no_grad():
            for name, p in module.named_parameters(remove_duplicate=False):
                if name not in self.params or id(p) in done:
                    continue
                v = self.params[name]
                v = v.full() if hasattr(v, "full") else v
                if not isinstance(v, torch.Tensor):
                    raise InputError(f"load_into: {name!r} has no global value in this result (its State has "
                                     f"no placement)")
                if tuple(v.shape) != tuple(p.shape):
                    raise InputError(f"load_into: parameter {name!r} of the module has shape {tuple(p.shape)} "
                                     f"but the run's has {tuple(v.shape)}; is this the module the step was "
                                     f"compiled from?")
                p.copy_(v.to(device=p.device, dtype=p.dtype))
                done.add(id(p))
                loaded.append(name)
            for name, b in module.named_buffers(remove_duplicate=False):  # state a forward updates (BatchNorm)
                v = self.params.get(name)
                v = v.full() if hasattr(v, "full") else v
                if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(b.shape) and id(b) not in done:
                    b.copy_(v.to(device=b.device, dtype=b.dtype))
                    done.add(id(b))
                    loaded.append(name)
        if not loaded:
            raise InputError(f"load_into: no parameter of this {type(module).__name__} is in the run (its "
                             f"parameters are {list(dict(module.named_parameters()))[:6]}; the run has "
                             f"{list(self.params)[:6]}); is this the module the step was compiled from?")
        missing = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in done]
        if strict and missing:
            raise InputError(f"load_into: the run has no value for trainable parameter(s) {missing} of the "
                             f"module (not used by the traced forward?); load_into(module, strict=False) "
                             f"loads the others")
        return loaded


def _combine(vals: list[torch.Tensor], how: str) -> torch.Tensor:
    if how == "last":
        return vals[-1]
    st = torch.stack(vals)
    return st if how == "stack" else (st.sum(0) if how == "sum" else st.mean(0))


def loss_value(v: torch.Tensor) -> float:
    """A step's global loss as a float (nan unless it is one number)."""
    return float(v.reshape(-1)[0]) if v.numel() == 1 else float("nan")


def _sink_step(a: Sink, by_rank: Mapping[int, Sequence[torch.Tensor]], firings: range, key: str) -> torch.Tensor:
    """One step's global value of a sink from every rank's values of ``firings`` (that step's)."""
    full = [_assemble(a.placement, a.sbp, {r: v[f] for r, v in by_rank.items()}, key) for f in firings]
    return _combine(full, a.micro_reduce) if a.scope == "micro" else full[0]


def step_loss(plan: ActorPlan, per_rank: Mapping[int, Mapping[str, list[torch.Tensor]]]) -> float | None:
    """The loss of one step from the values each rank's "loss" sink took in it (sink name -> tensors),
    computed exactly as ``assemble_results`` computes it for the whole run; None without a loss sink."""
    sink, by_rank = None, {}
    for r, rp in plan.ranks.items():
        for a in rp.actors:
            if isinstance(a, Sink) and a.key == "loss" and a.name in per_rank.get(r, {}):
                sink, by_rank[r] = a, per_rank[r][a.name]
    if sink is None:
        return None
    n = len(next(iter(by_rank.values())))
    return loss_value(_sink_step(sink, by_rank, range(n), "loss"))


def replica_sources(plan: ActorPlan) -> dict[tuple[int, str], tuple[int, str]]:
    """Keyed States whose local value is a copy of another rank's: (rank, State) -> (rank, State) it copies.

    Ranks that differ only in their coordinates on mesh axes where the State is B hold the same
    block, computed by the same collectives and updates: a run asks only the first of them for its
    final value (a data-parallel run of n ranks sends one copy of the model back, not n) and the
    driver hands that copy to the others. A State partial (P) on some axis has no copies."""
    first: dict[tuple, tuple[int, str]] = {}
    out: dict[tuple[int, str], tuple[int, str]] = {}
    for r, rp in plan.ranks.items():
        for a in rp.actors:
            if not isinstance(a, State) or not a.key or a.placement is None or r not in a.placement.rank_list:
                continue
            if any(not isinstance(x, (Broadcast, Split)) for x in a.sbp):
                continue
            where = tuple(c if isinstance(x, Split) else 0 for c, x in zip(a.placement.coords(r), a.sbp))
            sig = (a.key, a.placement, tuple(a.sbp), where)
            if sig in first:
                out[(r, a.name)] = first[sig]
            else:
                first[sig] = (r, a.name)
    return out


def assemble_results(plan: ActorPlan, steps: int, per_rank: dict[int, dict],
                     params: bool = True) -> tuple[dict, dict]:
    """Sinks (per key, per step) and final parameters (unless ``params`` is False), from every rank's
    local values."""
    M = plan.micro_batches
    sinks: dict[str, tuple[Sink, dict[int, list[torch.Tensor]]]] = {}
    states: dict[str, tuple[State, dict[int, torch.Tensor]]] = {}
    for r, rp in plan.ranks.items():
        for a in rp.actors:
            if isinstance(a, Sink):
                sinks.setdefault(a.key, (a, {}))[1][r] = unstack_values(per_rank[r]["sinks"][a.name])
            elif params and isinstance(a, State) and a.key and a.name in per_rank[r]["params"]:
                states.setdefault(a.key, (a, {}))[1][r] = per_rank[r]["params"][a.name]
    outputs: dict[str, list[torch.Tensor]] = {}
    for key, (a, by_rank) in sinks.items():
        per = M if a.scope == "micro" else 1
        outputs[key] = [_sink_step(a, by_rank, range(s * per, (s + 1) * per), key) for s in range(steps)]
    params: dict[str, Any] = {}
    for key, (a, by_rank) in states.items():
        if a.placement is None:
            params[key] = by_rank
            continue
        params[key] = _global(by_rank, a.placement, a.sbp, key)
    return outputs, params


def _assemble(placement, sbp, shards: dict[int, torch.Tensor], key: str) -> torch.Tensor:
    missing = [r for r in placement.rank_list if r not in shards]
    if missing:
        raise PlanError(f"sink {key!r}: ranks {missing} of its placement have no sink with that key")
    return assemble(shards, placement, sbp)


def _global(shards: dict[int, torch.Tensor], placement, sbp, key: str):
    try:
        from ..eager import from_local
    except ImportError:  # the eager layer is optional for the runtime
        return _assemble(placement, sbp, shards, key)
    # the replicas came from the same collectives; comparing every B copy of every parameter costs time
    return from_local({r: shards[r] for r in placement.rank_list}, placement=placement, sbp=sbp, check=False)
