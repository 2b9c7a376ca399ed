"""``simulate``: predict a compiled step's time, memory and timeline on a Hardware model.

    c = sl.compile(model, xs, loss_fn=..., target=y, strategy=sl.presets.dp_tp((8, 8)))
    pred = sl.simulate(c, sl.Hardware.h100_node())
    pred.step_time, pred.peak_memory, pred.breakdown, pred.critical_path
    sl.timeline(pred.trace)            # the same picture as a run's
    pred.compare(cluster.run(c, batch, steps=3))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from ..gc_pause import gc_paused
from ..hardware import Hardware, op_key
from ..ops.registry import TensorMeta
from ..runtime.actor_plan import ActorPlan
from ..runtime.fusion import fuse_chains
from ..runtime.specs import State
from .alike import alike_ranks, rank_orders, renamed
from .comm_time import CommInfo
from .engine import Engine
from .firing_cost import FiringCost, comm_cost, compute_cost, device_of
from .framework import Framework, overlapped_seconds
from .memory_model import warn_capacity
from .prediction import Prediction, memory_fields
from .register_memory import held_between_steps, peak_memory
from .shapes import batch_shapes, infer_like, infer_rank_shapes
from .sim_errors import SimulationError
from .step_pricing import StepPricing, pricing_of
from .symmetry import rank_classes
from .timing import rank_breakdown, step_ends, window


def plan_of(step: Any) -> tuple[ActorPlan, dict[str, TensorMeta], dict[str, CommInfo]]:
    """The ActorPlan of ``step``, the batch shapes its sources need, and what the compiler knows of its
    communication (mesh axis, bytes per rank) by actor name."""
    if isinstance(step, ActorPlan):
        return step, {}, {}
    if not (hasattr(step, "physical") and hasattr(step, "graph")):
        raise SimulationError(f"simulate needs a Compiled step (sl.compile(...)) or an ActorPlan, "
                              f"got {type(step).__name__}")
    if hasattr(step, "plan") and callable(step.plan):
        plan = step.plan()
    else:
        from ..compiler.lowering.to_actors import lower_to_actors

        plan = lower_to_actors(step.physical, step.graph)
    phys, graph = step.physical, step.graph
    batch = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        shape = list(t.shape)
        if shape:
            shape[0] *= phys.micro_batches  # the graph holds one micro-batch; sources cut the step's batch
        batch[name] = TensorMeta(tuple(shape), t.meta.dtype)
    known: dict[str, CommInfo] = {}
    for n in phys.nodes:
        st = n.attrs.get("plan_step") if n.kind == "boxing" else None
        if st is not None and n.collective is not None and st.mesh_axis is not None:
            known[f"c{n.collective}"] = CommInfo(n.op, st.mesh_axis, len(n.attrs.get("group", ())) or 1,
                                                 int(st.bytes_sent.get(n.rank, 0)))
    return plan, batch, known


def _check(plan: ActorPlan, hw: Hardware, steps: int) -> None:
    if not isinstance(hw, Hardware):
        raise SimulationError(f"simulate needs a Machine or Hardware (sl.Machine.a100_cluster(4), .h100_node(), "
                              f"sl.Hardware.cpu_box(), a calibrated one), got {type(hw).__name__}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise SimulationError(f"steps must be an int >= 1 (>= 2 for a steady-state step time), got {steps!r}")
    if not any(rp.n_actors for rp in plan.ranks.values()):
        raise SimulationError(f"plan {plan.name!r} has no actors on any of its {plan.world_size} ranks")


def default_hardware(step: Any, plan: ActorPlan) -> Hardware:
    """The machine a step is simulated on when none is named: the one it was compiled for, else its device's."""
    from .memory_model import reference_hardware

    compiled_for = getattr(getattr(step, "deduction", None), "hardware", None)
    return compiled_for if isinstance(compiled_for, Hardware) else reference_hardware(plan.device_type)


def simulate(step: Any, hardware: Hardware | None = None, *, steps: int = 3,
             feeds: Mapping[str, Any] | None = None, framework: Framework | None = None) -> Prediction:
    """Simulate ``steps`` training steps of ``step`` (a Compiled step or an ActorPlan) on ``hardware``
    (``hw`` below): by default the machine the step was compiled for, else the one its device implies
    (``sim.memory_model.reference_hardware``: a CPU box, or an H100 node for a CUDA step), the same
    default as ``step.memory``.

    feeds: for a hand-built plan with Source actors, each feed's batch (a tensor or a shape), as it
        would be given to ``cluster.run``; a Compiled step knows its own.
    A collective on mesh axis a uses ``hw.link(a)``: a Hardware with fewer axes than the mesh repeats its
    last axis's figures. ``hw.cores`` (ranks sharing a machine's cores) slows compute when more ranks
    compute at once than there are cores, and slows transfers that start while the cores compute
    (where the calibration measured it); it applies to CPU plans only (a GPU rank has its own device).
    A device-free step (a preset compiled without ``device=``) runs on ``hw``'s device (``device_of``).
    framework: predict another framework's run of the step (``sim/framework.py``: what it does beyond
        the graph, e.g. ``MEGATRON_LM_2021``); None: sbplab's runtime.
    A rank whose predicted peak exceeds ``hw``'s device memory (a Machine's device model) is named in a
    ``MemoryCapacityWarning``.
    """
    plan, batch, known = plan_of(step)
    hw = hardware if hardware is not None else default_hardware(step, plan)
    batch.update(batch_shapes(feeds))
    whole = framework is not None and framework.recompute_whole_layer
    return simulate_plan(plan, hw, steps=steps, batch=batch, comm=known, pricing=pricing_of(step, whole),
                         framework=framework)


def simulate_plan(plan: ActorPlan, hw: Hardware, *, steps: int = 3, batch: Mapping[str, TensorMeta] | None = None,
                  comm: Mapping[str, CommInfo] | None = None, pricing: StepPricing | None = None,
                  framework: Framework | None = None) -> Prediction:
    """``simulate`` on a plan already lowered (``plan_of`` gives plan, batch shapes and ``comm``, what the
    compiler knows of each collective; ``pricing_of(step)`` the step's precision, recomputation and
    work; ``pricing_of(step, framework.recompute_whole_layer)`` with a ``framework``), so lowering can be
    timed or cached apart from simulating."""
    _check(plan, hw, steps)
    with gc_paused():  # the simulation's many small objects all live until it ends
        return _simulate(plan, hw, steps, dict(batch or {}), dict(comm or {}), pricing, framework)


def _add_recompute(plan: ActorPlan, costs: dict[int, list[FiringCost]], redo: frozenset) -> None:
    """Per rank of ``costs``, the kernel seconds of the forward actors the backward repeats, spread over the
    rank's backward kernels in proportion to their own (the recomputation runs inside the backward)."""
    for r, row in costs.items():
        rp = plan.ranks[r]
        extra = sum(row[i].seconds - row[i].overhead for i, a in enumerate(rp.actors) if (r, a.name) in redo)
        back = [i for i, a in enumerate(rp.actors) if a.lane != "comm" and a.phase == "backward"
                and (row[i].measured or row[i].modelled)]
        total = sum(row[i].seconds - row[i].overhead for i in back)
        if extra <= 0 or total <= 0:
            continue
        f = 1 + extra / total
        for i in back:
            c = row[i]
            row[i] = replace(c, seconds=(c.seconds - c.overhead) * f + c.overhead)


def _add_optimizer_traffic(plan: ActorPlan, costs: dict[int, list[FiringCost]], shapes: dict, hw: Hardware,
                           device: str, per_param: float) -> None:
    """Per rank of ``costs``, the seconds of ``per_param`` bytes per parameter element it keeps (a framework's
    optimizer traffic beyond the graph's update), spread over the rank's update kernels in proportion to their
    own."""
    for r in costs:
        rp = plan.ranks[r]
        states = {a.name for a in rp.actors if isinstance(a, State)}
        params = {x.actor for a in rp.actors if a.phase != "update" for x in a.inputs if x.actor in states}
        numel = sum(m.numel for name in params for m in shapes[r][name].outputs)  # parameters: read outside the update
        row = costs[r]
        upd = [i for i, a in enumerate(rp.actors) if a.lane != "comm" and a.phase == "update"
               and (row[i].measured or row[i].modelled)]
        total = sum(row[i].seconds - row[i].overhead for i in upd)
        if not numel or total <= 0:
            continue
        extra, _ = hw.op_time(op_key("optimizer_traffic", [], "float32", device), 0.0, numel * per_param,
                              torch.float32)
        f = 1 + extra / total
        for i in upd:
            c = row[i]
            row[i] = replace(c, seconds=(c.seconds - c.overhead) * f + c.overhead)


def _simulate(plan: ActorPlan, hw: Hardware, steps: int, batch: dict[str, TensorMeta],
              known: dict[str, CommInfo], pricing: StepPricing | None = None,
              framework: Framework | None = None) -> Prediction:
    M = plan.micro_batches
    device = plan.device_type or device_of(hw)  # a device-free plan runs on the hardware's device
    low = pricing.compute_dtype if pricing is not None else None
    shapes, costs = {}, {}
    shape_cache: dict = {}
    cost_cache: dict = {}
    redo = pricing.recomputed if pricing is not None else frozenset()
    orders = rank_orders(plan)
    alike = alike_ranks(plan, M, batch, known, hw, redo, orders)  # shapes and costs: once per alike group
    lowered = {m: rep for rep, ms in (plan.alike or {}).items() for m in ms}  # lowered from one rank: alike
    inferred: dict[int, int] = {}  # lowering's representative -> the first rank of its group inferred
    first = None  # the first rank inferred
    for r in alike:  # groups of one lowering group share the shapes of all but a few actors; other groups
        rp = plan.ranks[r]  # mostly too (ZeRO's uneven shards): ``infer_like`` checks actor by actor
        q = inferred.get(lowered.get(r, -1), first)
        if q is None:
            shapes[r] = infer_rank_shapes(rp.actors, r, M, batch, shape_cache)
            first = r
        else:
            shapes[r] = infer_like(rp.actors, plan.ranks[q].actors, shapes[q], r, M, batch, shape_cache)
        if r in lowered:
            inferred.setdefault(lowered[r], r)
        row_c: list[FiringCost] = []
        for a in rp.actors:
            sh = shapes[r][a.name]
            row_c.append(comm_cost(a, r, sh, hw, known, low) if a.lane == "comm"
                         else compute_cost(a, sh, hw, device, cost_cache, low))
        costs[r] = row_c
    if redo:
        _add_recompute(plan, costs, redo)
    if framework is not None and framework.optimizer_bytes_per_param > 0:
        _add_optimizer_traffic(plan, costs, shapes, hw, device, framework.optimizer_bytes_per_param)
    rep_alike = {m: r for r, ms in alike.items() for m in ms}
    costs = {r: costs[rep_alike[r]] for r in plan.ranks}  # one list per alike group, read only from here
    sent_of = {r: [c.nbytes for c in costs[r]] for r in alike}
    sent = {r: sent_of[rep_alike[r]] for r in plan.ranks}
    classes = rank_classes(plan, costs, shapes, alike, orders)
    for r in classes:  # a class's lowest rank may not be its alike group's: its shapes under its own names
        if r not in shapes:
            q = rep_alike[r]
            shapes[r] = renamed(plan.ranks[q].actors, plan.ranks[r].actors, shapes[q])
    chains = {r: fuse_chains(plan.ranks[r].actors) for r in classes}  # read again by the memory model
    for r in classes:  # the ranks simulated: the runtime fires a fused chain as one actor, so its parts
        row_c = costs[r] = list(costs[r])  # after the first pay no firing overhead
        for i in {i for chain in chains[r][1] for i in chain[1:]}:
            row_c[i] = replace(row_c[i], seconds=row_c[i].seconds - row_c[i].overhead, overhead=0.0)
    work = {r: [c.seconds for c in costs[r]] for r in classes}  # the engine runs the classes' ranks
    busy_extra = {r: [c.busy_extra for c in costs[r]] for r in classes}
    firings = Engine(plan, steps, work, hw.cores, classes, busy_extra, device).run()
    step_of = {r: [M if a.scope == "micro" else 0 for a in plan.ranks[r].actors] for r in classes}
    ends = step_ends(firings, step_of, steps)
    lo, hi, n = window(ends)
    mem = peak_memory(firings, {r: plan.ranks[r].actors for r in classes}, shapes, hi, chains=chains)
    kept = {r: held_between_steps(plan.ranks[r].actors, shapes[r]) for r in classes}
    per_rep = rank_breakdown(firings, list(classes), lo, hi, n)
    if framework is not None and framework.grad_reduce_after_backward:  # the overlap becomes a serial tail
        tail = {r: overlapped_seconds(firings, r, {i for i, a in enumerate(plan.ranks[r].actors) if a.lane == "comm"
                                                   and a.phase == "backward" and a.scope == "step"}, lo, hi) / n
                for r in classes}
        longest = max(tail.values(), default=0.0)
        for r, t in tail.items():
            per_rep[r]["exposed communication"] += t
            per_rep[r]["idle"] += longest - t
        hi += longest * n
    rep_of = {m: r for r, ms in classes.items() for m in ms}
    peak, parts, at = memory_fields({m: mem[rep_of[m]] for m in plan.ranks})
    warn_capacity(peak, hw, stacklevel=5)
    return Prediction(plan=plan, hardware=hw, steps=steps, step_time=(hi - lo) / n, step_ends=ends,
                      peak_memory=peak, memory_breakdown=parts, breakdown={m: dict(per_rep[rep_of[m]])
                                                                           for m in plan.ranks},
                      measured_fraction=_measured_fraction(plan, costs, alike), firings=firings, sent_bytes=sent,
                      classes=classes, window_start=lo if steps > 1 else 0.0, memory_at_us=at, pricing=pricing,
                      memory_kept={m: kept[rep_of[m]] for m in plan.ranks})


def _measured_fraction(plan: ActorPlan, costs: dict[int, list[FiringCost]], alike: dict[int, list[int]]) -> float:
    """Measured kernel seconds over all kernel seconds of one step (firings per step weigh each actor); an
    alike group's (``alike_ranks``) kernels and costs are its first rank's, counted once per member."""
    M, measured, total = plan.micro_batches, 0.0, 0.0
    for r, members in alike.items():
        mine_m, mine_t = 0.0, 0.0
        for a, c in zip(plan.ranks[r].actors, costs[r]):
            if not (c.measured or c.modelled):
                continue
            t = (c.seconds - c.overhead) * (M if a.scope == "micro" else 1)
            mine_t += t
            mine_m += t if c.measured else 0.0
        total += mine_t * len(members)
        measured += mine_m * len(members)
    return measured / total if total > 0 else 0.0
