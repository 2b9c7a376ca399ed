"""``sl.search``: find a parallel strategy for a model on ``devices`` ranks of a ``Hardware``.

    res = sl.search(model, (x,), loss_fn=model.loss_fn, target=y, devices=8,
                    hardware=sl.Hardware.h100_node(), method="auto")
    print(res.table()); print(res.explain())
    step = sl.compile(model, (x,), loss_fn=model.loss_fn, target=y, strategy=res.strategy)

The space: every 1-D and 2-D mesh of ``devices`` (with each valid mapping of mesh axes to the
hardware's links), a signature per forward op, ZeRO level 0, 2 or 3, and pipelines of S stages with a
contiguous cut of the layers and M micro-batches. Every candidate is priced by one analytic model
(``cost.py``); the few best are compiled and re-ranked by ``sl.simulate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..compiler.ir import Graph, GraphError
from ..compiler.training.optim import as_optimizer
from ..compiler.training.training_graph import CAPTURES, trace_training_graph
from ..hardware import Hardware
from ..machine import Machine
from .box_prices import BoxPrices
from .candidate import Candidate
from .capacity import check_device_bound, device_capacity
from .clock import Clock
from .cost import ZERO_LEVELS, Pricer
from .inputs import SearchInputs, check_inputs
from .mesh import MeshChoice, check_devices, mesh_choices
from .pipeline import best_cut, blocks_of, price_stages
from .presets_eval import PresetChoice, PresetSpec, applicable_presets, preset_choice
from .problem import Edge, OpProblem, PricedOps, build_problem, floor_edges, latency_edges, price_ops
from .rebatch import Captures, rebatch
from .rerank import rerank, rerank_units
from .result import SearchResult
from .search_errors import SearchError
from .search_progress import ProgressCallback, ProgressReporter
from .solve import METHODS, solve_space
from .stage_floor import StageFloor, micro_edges
from .user_candidates import check_candidates, user_candidates


class Space:
    """The training graphs (one per micro-batch count) and priced problems, built on first use."""

    def __init__(self, model: torch.nn.Module, inputs: Any, loss_fn: Callable | None, target: Any, optimizer: Any,
                 hw: Hardware, capture: str = "auto") -> None:
        given = inputs if isinstance(inputs, SearchInputs) else check_inputs(inputs, target, loss_fn)
        self.model, self.given, self.loss_fn, self.optimizer, self.hw = model, given, loss_fn, optimizer, hw
        self.inputs, self.target, self.capture = given.inputs, given.target, capture
        self.batch = given.batch  # every micro-batch count the search tries divides it
        self._graphs: dict[int, Graph] = {}
        self._problems: dict[tuple[MeshChoice, int], OpProblem] = {}
        self._priced: dict[tuple[MeshChoice, int], PricedOps] = {}  # ops priced, edges not yet
        self._floors: dict[tuple[MeshChoice, int], StageFloor] = {}
        self._latencies: dict[MeshChoice, list[Edge]] = {}  # the one-micro-batch graph's (``_latency``)
        self._one_device: tuple[float, StageFloor] | None = None  # the ops' least compute and the moves on one
        # device (``flat_floor``)
        self.boxes = BoxPrices()  # boxing prices shared by every mesh and micro-batch size
        self.captures = Captures()  # an ATen capture once; a micro-batch's graph derived from it (``rebatch.py``)
        self.rebatched = 0  # training graphs derived from another micro-batch count's (``_rebatched``)

    def graph(self, m: int) -> Graph:
        """The training graph of ``m`` micro-batches, built as ``sl.compile`` builds it (the same function,
        capture and optimizer, so op names match and the candidates' signature hints apply): torch.fx onto
        sbplab's op library where it maps the whole model, else the ATen capture (``capture="auto"``)."""
        if m not in self._graphs:
            got = self._rebatched(m)
            if got is None:
                with torch.device("meta"):  # pricing needs shapes only: no logits of a big model are allocated
                    got = trace_training_graph(self.model, self.inputs, self.loss_fn, self.target, m,
                                               self.optimizer, capture=self.capture, capture_fn=self.captures)
            self._graphs[m] = got
        return self._graphs[m]

    def _rebatched(self, m: int) -> Graph | None:
        """The training graph of ``m`` micro-batches derived (``rebatch``) from one of k > 1 micro-batches built
        already, k dividing m: the same ops (gradients accumulated over micro-batches, the same update), only
        smaller micro-batches, so no trace (torch.fx's and the backward's take about as long as the ATen
        capture ``Captures`` saves). None where rebatch's rules refuse (one sample, ambiguous sizes)."""
        for k, g in sorted(self._graphs.items()):
            if 1 < k < m and m % k == 0:
                got = rebatch(g, g.grads, self.batch // k, self.batch // m)
                if got is not None:
                    got.micro_batches = m
                    self.rebatched += 1
                    return got
        return None

    def traced(self, m: int) -> bool:
        """Whether the training graph of ``m`` micro-batches is built already (``graph``)."""
        return m in self._graphs

    def priced_ops(self, mesh: MeshChoice, m: int = 1) -> PricedOps:
        """The ops of ``problem(mesh, m)`` priced, its edges not: enough for a lower bound."""
        key = (mesh, m)
        if key not in self._priced:
            self._priced[key] = price_ops(self.graph(m), mesh, self.hw, m, self.boxes)
        return self._priced[key]

    def stage_floor(self, mesh: MeshChoice, m: int) -> StageFloor:
        """A floor under every pipeline of stage mesh ``mesh`` and ``m`` micro-batches: its ops priced,
        its edges at their floors (``stage_floor.py``), before the real edges are worth pricing."""
        key = (mesh, m)
        if key not in self._floors:
            ops = self.priced_ops(mesh, m)
            self._floors[key] = StageFloor(ops.ops, floor_edges(ops))
        return self._floors[key]

    def pre_floor(self, mesh: MeshChoice, stages: int, m: int, zero: int) -> float:
        """A floor under every pipeline of ``stages`` stages of mesh ``mesh`` and ``m`` micro-batches, from the
        one-micro-batch graph: no graph of ``m`` micro-batches is traced (an ATen capture takes seconds).

        A micro-batch of 1/m of the batch costs at least 1/m of the whole batch's time per op and per
        edge (FLOPs and activation bytes scale with the batch, weights and latencies do not), and the
        once-per-step gradient work is the same, so the bound of ``stage_floor.py`` with every
        per-micro-batch term priced at the whole batch and counted (m + S - 1) / m times is below it.
        Tighter where the hardware prices ops by a model (no measured table): each op's compute is priced
        at 1/m of its FLOPs and bytes (``micro_floor``), which its micro-batch does at least, and a
        smaller kernel is no more efficient; ZeRO-3's gathers move whole parameters every micro-batch."""
        return self.micro_floor(mesh, m).value(zero, (m + stages - 1) / m) / stages

    def flat_floor(self, stages: int, m: int, devices: int) -> float:
        """A floor under every pipeline of ``stages`` stages over ``devices`` devices and ``m`` micro-batches,
        whatever its stage mesh and ZeRO level: made from the one-device prices, once per search.

        ``pre_floor`` is, per op, (m + S - 1) / m times its least compute over the signatures of the stage
        mesh's k = devices / S ranks (priced at 1/m of the work, times m), plus gathers, syncs and edges
        (none negative), summed and divided by S. An op's compute on a rank is its forward on the rank's piece
        plus its backward at the piece's fraction of the FLOPs: the piece a signature gives the first rank
        (the one priced, which a balanced split gives the largest block) holds at least 1/k of the work, and a
        smaller kernel is no more efficient, so it takes at least 1/k of the op's time on one device. So
        (m + S - 1) / m x (the ops' one-device time) / devices is below ``pre_floor`` of every stage mesh,
        and a space it rules out is skipped without pricing its mesh. No compute where the hardware has
        measured op times (a table's small kernel may be priced apart from the whole op).

        Plus the moves of the S - 1 cuts (``StageFloor.cuts``) at 1/k of the one-device moves: a rank sends
        at least 1/k of a tensor (its block is the largest), and a micro-batch's move of 1/m of it, m times,
        at least the whole's. So it is below ``moved_floor`` of every stage mesh (which has them too)."""
        if self._one_device is None:
            one = self.priced_ops(MeshChoice((1,), (0,)))
            self._one_device = (0.0 if self.hw.op_times else sum(float(np.min(o.compute)) for o in one.ops),
                                StageFloor(one.ops, floor_edges(one)))
        compute, moves = self._one_device
        k = devices // stages
        return (m + stages - 1) / m * (compute / devices + moves.cuts(stages) / k / stages)

    def micro_floor(self, mesh: MeshChoice, m: int) -> StageFloor:
        """``stage_floor(mesh, 1)`` with each op's compute priced at 1/m of its work (``Pricer.work_scale``)
        and gathers counted per micro-batch, both times m: over (m + S - 1) / m rounds, (m + S - 1) micro-batch
        ops and gathers. The batch's own prices where the hardware has a measured op table (keyed by the
        batch's shapes, so a scaled op would be priced as the whole one)."""
        key = (mesh, -m)
        if key not in self._floors:
            self._floors[key] = StageFloor(self._micro_ops(mesh, m), self.stage_floor(mesh, 1).edges)
        return self._floors[key]

    def moved_floor(self, mesh: MeshChoice, stages: int, m: int, zero: int) -> float:
        """``pre_floor`` with what every micro-batch pays whole (each edge's least latency rounds, each move's
        latency: ``micro_edges``) and the moves of the S - 1 cuts (``StageFloor.cuts``): still the
        one-micro-batch graph's ops and edge floors, so no graph traced and no real edge priced."""
        key = (mesh, -m, "moved")
        if key not in self._floors:
            edges = self.stage_floor(mesh, 1).edges
            self._floors[key] = StageFloor(self._micro_ops(mesh, m), micro_edges(edges, self._latency(mesh), m))
        return self._floors[key].value(zero, (m + stages - 1) / m, stages) / stages

    def _latency(self, mesh: MeshChoice) -> list:
        """The one-micro-batch graph's edges on ``mesh`` at their least latency rounds (``latency_edges``)."""
        got = self._latencies.get(mesh)
        if got is None:
            done = self._problems.get((mesh, 1))
            got = self._latencies[mesh] = latency_edges(done if done is not None else self.priced_ops(mesh, 1))
        return got

    def real_pre_floor(self, mesh: MeshChoice, stages: int, m: int, zero: int) -> float:
        """``pre_floor`` with the edges of the one-micro-batch graph at their real prices (``problem(mesh)``),
        still no graph of ``m`` micro-batches traced: a boxing of 1/m of a tensor takes at least 1/m of the
        whole one's bytes time, and its route's latency rounds whole, every micro-batch (``micro_edges``)."""
        key = (mesh, -m, "real")
        if key not in self._floors:
            lat = self._latency(mesh)  # before ``problem`` takes the priced ops
            edges = micro_edges(self.problem(mesh).edges, lat, m)
            self._floors[key] = StageFloor(self._micro_ops(mesh, m), edges)
        return self._floors[key].value(zero, (m + stages - 1) / m, stages) / stages

    def _micro_ops(self, mesh: MeshChoice, m: int) -> list:
        """The one-micro-batch graph's ops on ``mesh`` with compute at 1/m of the work and gathers per
        micro-batch, both times m (``micro_floor``); the batch's own where the hardware has a measured table."""
        done = self._problems.get((mesh, 1))
        base = done if done is not None else self.priced_ops(mesh, 1)  # its ops: priced once either way
        if m == 1 or self.hw.op_times:
            return base.ops
        # on a roofline (``Hardware.op_time`` without a table) 1/m of an op's FLOPs and bytes takes exactly 1/m
        # of its time, so times m it is the op's own price: only a machine model with efficiency by size
        # (a ``Machine``'s device) prices the smaller kernel anew
        same = type(base.hw).op_time is Hardware.op_time or (isinstance(base.hw, Machine) and base.hw.device is None)
        pricer = None if same else Pricer(base.graph, mesh.placement(), base.hw, self.boxes, work_scale=1.0 / m)
        scaled: dict[int, tuple[np.ndarray, dict[int, np.ndarray]]] = {}  # identical layers share arrays
        ops = []
        for o in base.ops:
            got = scaled.get(id(o.compute))
            if got is None:
                compute = o.compute if pricer is None else \
                    np.array([pricer.compute_time(o.op, s) for s in o.sigs]) * m
                got = scaled[id(o.compute)] = (compute, {z: g * m for z, g in o.gather.items()})
            ops.append(replace(o, compute=got[0], gather=got[1]))
        return ops

    def problem(self, mesh: MeshChoice, m: int = 1) -> OpProblem:
        key = (mesh, m)
        if key not in self._problems:
            priced = self._priced.pop(key, None)  # the ops priced for a bound: only the edges are left
            self._problems[key] = build_problem(self.graph(m), mesh, self.hw, m, self.boxes, priced)
        return self._problems[key]


def _check_args(devices: object, hardware: object, memory_limit: object, method: str, time_budget: object) -> None:
    check_devices(devices)
    check_device_bound(devices)
    if hardware is not None and not isinstance(hardware, Hardware):
        raise SearchError(f"sl.search: hardware must be an sl.Hardware (Hardware.h100_node(), .cpu_box(), a "
                          f"calibrated one), got {type(hardware).__name__}")
    if memory_limit is not None and (not isinstance(memory_limit, (int, float)) or memory_limit <= 0):
        raise SearchError(f"sl.search: memory_limit must be a positive number of bytes per device or None, "
                          f"got {memory_limit!r}")
    if method not in METHODS:
        raise SearchError(f"sl.search: method must be one of {', '.join(METHODS)}; got {method!r}")
    if time_budget is not None and (not isinstance(time_budget, (int, float)) or time_budget <= 0):
        raise SearchError(f"sl.search: time_budget must be a positive number of seconds or None, got {time_budget!r}")


def _measure_args(cluster: Any, devices: int, top: int, given: SearchInputs) -> tuple | None:
    """(cluster, batch) to measure the finalists with, or None; a cluster that cannot serve says why."""
    if cluster is None:
        return None
    if not (hasattr(cluster, "run") and hasattr(cluster, "n")):
        raise SearchError(f"sl.search: measure_on must be a LocalCluster (spawned or external workers), got "
                          f"{type(cluster).__name__}")
    if cluster.n != devices:
        raise SearchError(f"sl.search: measure_on has {cluster.n} ranks but the search is for devices={devices}; "
                          f"measure on a cluster of {devices} ranks")
    if top <= 0:
        raise SearchError("sl.search: measure_on runs the finalists of the simulated re-rank; it needs "
                          "rerank_top > 0 and simulate=True")
    if any(t.is_meta for t in given.tensors):
        raise SearchError("sl.search: measure_on trains on the given batch, so inputs and target must be real "
                          "tensors, not meta ones")
    return cluster, given.feeds()


def _identity_mesh(shape: tuple[int, ...], hw: Hardware) -> MeshChoice:
    """The mesh a preset's placement means: axis a on link a (row-major ranks, as ``as_mesh`` lays them)."""
    last = len(hw.axis_bandwidth) - 1
    return MeshChoice(shape, tuple(min(a, last) for a in range(len(shape))) if len(shape) > 1 else (0,))


def _price_preset(space: Space, pc: PresetChoice) -> Candidate:
    spec = pc.spec
    mesh = _identity_mesh(pc.mesh_shape, space.hw)
    pr = space.problem(mesh, spec.micro_batches)
    assign = pr.assignment(pc.signatures)
    if spec.n_stages > 1:
        pc_cost = price_stages(pr, assign, spec.zero, [pc.stage_of_op[o.name] for o in pr.ops], spec.n_stages)
        return Candidate(spec.name, "preset", mesh, spec.zero, spec.n_stages, spec.micro_batches, assign,
                         pc_cost.step_time, pc_cost.memory, pr, pc_cost.stage_of_op, _strategy=pc.strategy)
    return Candidate(spec.name, "preset", mesh, spec.zero, 1, 1, assign, pr.cost(assign, spec.zero),
                     pr.memory(assign, spec.zero), pr, _strategy=pc.strategy)


def search(model: torch.nn.Module, inputs: Any, *, target: torch.Tensor | None = None,
           loss_fn: Callable | None = None, optimizer: Any = None, devices: int = 8, hardware: Hardware | None = None,
           memory_limit: float | None = None, method: str = "auto", time_budget: float | None = None,
           seed: int = 0, pipelines: bool = True, zero_levels: tuple[int, ...] = ZERO_LEVELS,
           node_size: int | None = None, max_mesh_ndim: int = 2, reduce: bool | None = None,
           rerank_top: int = 3, simulate: bool = True, on_progress: ProgressCallback | None = None,
           measure_on: Any = None, capture: str = "auto", candidates: Any = None) -> SearchResult:
    """Search strategies for ``model`` (traced like ``sl.compile``) on ``devices`` ranks of ``hardware``.

    memory_limit: bytes per device no strategy may exceed (analytic memory; the simulator's where
        re-ranked); if none meets it, a SearchError says the least any strategy needs. None: the device
        memory of ``hardware`` where its machine model knows it (a note says so), else no limit.
    method: "exhaustive" (tiny graphs), "exact" (ILP), "cd" (coordinate descent), "mcmc", or "auto".
    time_budget: seconds for the whole search, tracing and the simulated re-rank included; when it runs out,
        the best found so far is returned with ``best_so_far`` set (work already begun, one space's solve or
        one finalist's simulation, ends first). ``devices`` above ``capacity.MAX_DEVICES`` is refused.
    reduce: merge follower ops and tie repeated layers (``shrink.py``); default: above 40 forward ops.
    rerank_top: how many of the cheapest searched candidates to compile and re-rank by ``sl.simulate``,
        beside every preset and user candidate; a preset the simulator predicts faster wins.
    candidates: your own strategies (``sl.Strategy``, on at most ``devices`` ranks) to compare: each is
        priced, simulated and listed in ``res.table()`` with the presets, and wins if it is fastest.
    on_progress: called with a ``SearchProgress`` after each unit of work (a preset priced, a space
        solved, a finalist simulated) and once at the end; for a progress bar. Without it nothing extra runs.
    measure_on: a ``LocalCluster`` of ``devices`` ranks: the finalists the re-rank simulated, and every
        preset, also run on it for a few steps, and the fastest measured wins (``measure.py``); each gets
        ``measured_time``.
        ``inputs`` and ``target`` must then be real tensors (the batch the runs train on).
    inputs: as ``sl.compile`` takes them: a tensor, a tuple of positional tensors, or a dict of keyword
        tensors (``{"input_ids": x, "labels": x}``); ``loss_fn`` None when the model returns its own loss.
        Every tensor has the batch on dim 0; micro-batches slice every one of them.
    capture: how the model is traced, as in ``sl.compile``: "auto" (torch.fx onto sbplab's op library
        where it maps the whole model, else the ATen capture), "aten" or "fx".
    """
    if not isinstance(model, torch.nn.Module):
        raise SearchError(f"sl.search needs a torch.nn.Module to search strategies for, got {type(model).__name__}")
    _check_args(devices, hardware, memory_limit, method, time_budget)
    if on_progress is not None and not callable(on_progress):
        raise SearchError(f"sl.search: on_progress must be a function of one SearchProgress or None, got "
                          f"{type(on_progress).__name__}")
    if capture not in CAPTURES:
        raise SearchError(f"sl.search: capture must be one of {CAPTURES} (as sl.compile takes it), got {capture!r}")
    clock = Clock(time_budget)  # the budget covers everything from here, tracing included
    hw = hardware or Hardware.cpu_box()
    users_given = check_candidates(candidates, int(devices))
    notes: list[str] = []
    limit_from = ""
    if memory_limit is None:
        memory_limit = device_capacity(hw)
        if memory_limit is not None:
            limit_from = " (the device memory of the hardware)"

            notes.append(f"memory_limit: {memory_limit / 2**30:.4g} GiB per device, the device memory of the "
                         f"hardware (pass memory_limit= to change it)")
    given = check_inputs(inputs, target, loss_fn)
    optimizer = as_optimizer(optimizer)  # refused before tracing, as sl.compile refuses it
    measure = _measure_args(measure_on, int(devices), rerank_top if simulate else 0, given)
    space = Space(model, given, loss_fn, given.target, optimizer, hw, capture)
    try:
        space.graph(1)
    except GraphError as e:  # unsupported ops, bad shapes, a model torch.export cannot capture: before any search
        raise SearchError(f"sl.search: the model cannot be compiled, so there is nothing to search:\n{e}") from e
    if any(z not in ZERO_LEVELS for z in zero_levels):
        raise SearchError(f"sl.search: zero_levels must be drawn from {ZERO_LEVELS}, got {zero_levels}")
    report = ProgressReporter(on_progress, clock, memory_limit)
    meshes = mesh_choices(int(devices), hw, node_size, max_mesh_ndim)
    pipe_spaces = _pipeline_spaces(space, int(devices), node_size) if pipelines else []
    specs = applicable_presets(int(devices), space.batch, pipelines)
    top = max(0, rerank_top) if simulate else 0
    if top and measure is None and hw.cores is not None and devices > hw.cores:
        notes.append(_OVERSUBSCRIBED.format(devices=devices, cores=hw.cores))
    finalists = rerank_units(top, len(specs), measure=measure is not None, users=len(users_given))  # finalists simulated (measured), buckets
    if report.active:  # the whole plan up front, so the bar moves steadily
        report.plan(len(specs) + len(meshes) * len(zero_levels) + len(pipe_spaces) * len(zero_levels)
                    + finalists)
    presets = _presets(space, [s for s in specs if s.n_stages == 1], clock, notes, report)
    users = user_candidates(users_given, space.graph, lambda pc: _price_preset(space, pc), hw)
    found: list[Candidate] = []
    least: list[tuple[int, str]] = []
    for mesh in meshes:
        if clock.expired() and found:
            break
        pr = space.problem(mesh)
        for z in zero_levels:
            least.append((pr.min_memory(z), f"{mesh.describe(hw)}, ZeRO-{z}"))
            seeds = [p.assign for p in presets if p.mesh.shape == mesh.shape and p.n_stages == 1 and p.zero == z]
            assign, ran = solve_space(pr, z, method, memory_limit, clock, seeds, seed, reduce)
            if assign is None:
                report.step("meshes")
                continue
            c = Candidate(f"searched ({ran})", ran, mesh, z, 1, 1, assign, pr.cost(assign, z), pr.memory(assign, z), pr)
            clock.record(ran, c.step_time)
            found.append(c)
            report.step("meshes", c)
            if clock.expired():
                break
    presets += _pipeline_presets(space, [s for s in specs if s.n_stages > 1], int(devices), found + presets, clock,
                                 notes, report)
    if pipe_spaces and not clock.expired():
        found += _pipelines(space, method, memory_limit, clock, seed, zero_levels, reduce, least, report,
                                 pipe_spaces, found, max(1, top), notes)
    feasible = [c for c in found if c.feasible(memory_limit)]
    if not feasible:
        if memory_limit is not None and least:
            need, where = min(least)
            raise SearchError(f"sl.search: no strategy fits memory_limit={memory_limit:.4g} B per device{limit_from}; the least "
                              f"memory any strategy needs is {need} B ({need / 2**20:.2f} MiB) per device, with "
                              f"{where}")
        raise SearchError("sl.search: the time budget ran out before any candidate was priced; raise time_budget")
    feasible.sort(key=lambda c: c.step_time)
    best, predicted = rerank(feasible, top, model, space.inputs, loss_fn, space.target, optimizer, hw, memory_limit,
                             notes,
                             on_each=(lambda c: report.step("simulating")) if report.active else None,
                             presets=presets, units=finalists, measure=measure, graphs=space.graph, clock=clock,
                             users=users)
    used = best.mesh.size * best.n_stages
    if used < devices:
        notes.append(f"the chosen strategy uses {used} of the {devices} devices given: the others stay idle")
    report.finish(best)
    return SearchResult(best, predicted, best.mesh.hardware(hw), feasible, presets, clock.history, clock.ran_out,
                        method, clock.elapsed(), notes, users, int(devices))


_OVERSUBSCRIBED = (
    "{devices} CPU ranks share {cores} cores: there the simulator's step times are the least reliable (every "
    "transfer waits for the scheduler, a pipeline's point-to-point messages most), so the re-rank may prefer "
    "a strategy that runs slower; sl.search(..., measure_on=cluster) runs the finalists and keeps the fastest")


def _presets(space: Space, specs: list[PresetSpec], clock: Clock, notes: list[str],
             report: ProgressReporter, at_least_one: bool = True) -> list[Candidate]:
    """Every spec priced (``_price_preset``), until the time budget runs out (after ``at_least_one``)."""
    out = []
    for i, spec in enumerate(specs):
        if clock.expired() and (out or not at_least_one):
            notes.append(f"the time budget ran out while pricing presets: {len(specs) - i} of {len(specs)} not "
                         f"priced ({', '.join(s.name for s in specs[i:i + 3])}{', ...' if len(specs) - i > 3 else ''})")
            for _ in specs[i:]:
                report.step("presets")
            break
        try:
            pc = preset_choice(space.graph(spec.micro_batches), spec, space.hw)
            c = _price_preset(space, pc)
        except (ValueError, GraphError) as e:  # a preset that does not fit this model
            notes.append(f"preset {spec.name} skipped: {str(e).splitlines()[0]}")
            report.step("presets")
            continue
        clock.record("presets", c.step_time)
        out.append(c)
        report.step("presets")
    return out


PRESET_SLACK = 3.0  # a pipeline preset whose floor is this many times the best found could not be best


def _pipeline_presets(space: Space, specs: list[PresetSpec], devices: int, found: list[Candidate], clock: Clock,
                      notes: list[str], report: ProgressReporter) -> list[Candidate]:
    """The pipeline presets that could be best, priced (``_presets``) after the meshes were solved.

    Each needs the training graph of its micro-batch count, an ATen capture of seconds for a big model,
    so it is traced only for a preset that could win: one whose micro-batches split over its inner data
    parallel ranks, and whose floor (``Space.pre_floor``, from the one-micro-batch graph) is below
    ``PRESET_SLACK`` times the best analytic step time found so far (the slack: the simulator, which
    ranks the finalists, may disagree with the analytic model)."""
    best = min((c.step_time for c in found), default=float("inf"))
    keep = []
    for spec in specs:
        k = devices // spec.n_stages
        if k > 1 and (space.batch // spec.micro_batches) % k:
            notes.append(f"preset {spec.name} skipped: micro-batches of {space.batch // spec.micro_batches} "
                         f"samples cannot be split over its {k} data-parallel ranks")
            report.step("presets")
            continue
        try:
            floor = space.pre_floor(_identity_mesh((k,), space.hw), spec.n_stages, spec.micro_batches, spec.zero)
        except (ValueError, GraphError):
            floor = 0.0  # no floor: price it
        if floor > PRESET_SLACK * best:
            notes.append(f"preset {spec.name} not priced: even perfectly balanced, its stages take at least "
                         f"{floor * 1e3:.4g} ms/step, over {PRESET_SLACK:g}x the best found ({best * 1e3:.4g} ms)")
            report.step("presets")
            continue
        keep.append(spec)
    return _presets(space, keep, clock, notes, report, at_least_one=False)


def _pipeline_spaces(space: Space, devices: int, node_size: int | None) -> list[tuple[int, int, MeshChoice]]:
    """(stages S, micro-batches M, stage mesh) to solve: 2, 4, 8 stages where the layers allow, 2S and 4S
    micro-batches where the batch divides, every mesh of the ranks one stage gets."""
    n_layers = len(blocks_of(space.priced_ops(MeshChoice((1,), (0,))).ops))
    out = []
    for S in (2, 4, 8):
        if devices % S or S > n_layers:
            continue
        k = devices // S
        for M in (2 * S, 4 * S):
            if space.batch % M:
                continue
            out += [(S, M, mesh) for mesh in mesh_choices(k, space.hw, node_size)]
    return out


def _kth_best(found: list[Candidate], memory_limit: float | None, k: int) -> float:
    """The ``k``-th least analytic step time among the feasible candidates found (inf if fewer)."""
    times = sorted(c.step_time for c in found if c.feasible(memory_limit))
    return times[k - 1] if len(times) >= k else float("inf")


def _real_floor(pr: OpProblem) -> StageFloor:
    """The same bound on ``pr``'s real edge prices, kept with the problem (every ZeRO level asks)."""
    return pr.derived("stage_floor", lambda p: StageFloor(p.ops, p.edges))


def _pipelines(space: Space, method: str, memory_limit: float | None, clock: Clock, seed: int,
               zero_levels: tuple[int, ...], reduce: bool | None, least: list, report: ProgressReporter,
               spaces: list[tuple[int, int, MeshChoice]], found: list[Candidate], keep: int,
               notes: list[str]) -> list[Candidate]:
    """Pipelines of 2, 4, 8 stages (where the layers allow), 2S and 4S micro-batches, each stage mesh
    solved on the micro-batch graph and cut by the dynamic program.

    Pricing a stage space's edges is the costly part, so each (space, ZeRO level) first gets a lower
    bound (``stage_floor.py``: its ops, the edges inside its layers at their floors, stages perfectly
    balanced). Spaces go cheapest bound first, and one whose bound is no better than the ``keep``-th best
    feasible candidate so far could not reach the re-rank, so it is skipped unsolved; once a space's
    edges are priced, the same bound on its real prices may still skip a ZeRO level's solve."""
    bounds = []
    first = _kth_best(found, memory_limit, keep)  # only falls as pipelines are found
    for S, M, mesh in spaces:
        if clock.expired():
            break
        flat = space.flat_floor(S, M, mesh.size * S)  # every stage mesh and ZeRO level: no mesh priced
        if flat >= first:
            bounds += [(flat, S, M, mesh, z) for z in zero_levels]
            continue
        try:
            pre = [space.pre_floor(mesh, S, M, z) for z in zero_levels]  # the one-micro-batch graph only
        except (ValueError, GraphError):
            for _ in zero_levels:
                report.step("pipelines")
            continue
        bounds += [(b, S, M, mesh, z) for b, z in zip(pre, zero_levels)]
    bounds.sort(key=lambda b: b[0])
    out: list[Candidate] = []
    skipped = 0
    for bound, S, M, mesh, z in bounds:
        if clock.expired():
            break
        kth = _kth_best(found + out, memory_limit, keep)
        if bound >= kth:  # its first floor rules it out (``flat_floor`` or ``pre_floor``)
            skipped += 1
            report.step("pipelines")
            continue
        # then what every micro-batch pays whole and the cuts' moves (``moved_floor``, no real edge priced),
        # the one-micro-batch graph's real edges (``real_pre_floor``) and the micro-batch graph's floor
        # (``stage_floor``): a space is solved only if every floor lets it win, so their order changes only
        # the cost. The micro-batch graph is traced only for a space the first floors let win; once traced
        # (a preset or an earlier space needed it), its floor goes before the real edges: far tighter, and
        # cheaper than pricing the stage mesh's real edges
        floor = bound
        try:
            for which in ("moved", "stage", "real") if space.traced(M) else ("moved", "real", "stage"):
                if floor >= kth:
                    break
                floor = space.moved_floor(mesh, S, M, z) if which == "moved" else \
                    space.real_pre_floor(mesh, S, M, z) if which == "real" else \
                    space.stage_floor(mesh, M).value(z, M + S - 1, S) / S
        except (ValueError, GraphError):
            report.step("pipelines")
            continue
        pr = space.problem(mesh, M) if floor < kth else None  # real edges only where the floor lets it win
        if pr is None or _real_floor(pr).value(z, M + S - 1, S) / S >= kth:
            skipped += 1
            report.step("pipelines")
            continue
        assign, ran = solve_space(pr, z, method, None, clock, [], seed, reduce)
        cut = best_cut(pr, assign, z, S) if assign is not None else None
        if cut is None:
            report.step("pipelines")
            continue
        least.append((cut.memory, f"{S} stages of {mesh.describe(space.hw)}, ZeRO-{z}"))
        c = Candidate(f"searched ({ran})", ran, mesh, z, S, M, assign, cut.step_time, cut.memory, pr,
                      cut.stage_of_op, note=f"bubble {cut.bubble:.0%}")
        clock.record(ran, c.step_time)
        out.append(c)
        report.step("pipelines", c)
    if skipped:
        notes.append(f"{skipped} of {len(bounds)} pipeline spaces (stages, micro-batches, stage mesh, ZeRO level) "
                     f"skipped unsolved: even with stages perfectly balanced and each layer at its least cost, "
                     f"they could not beat the {keep} best candidates found")
    return out
