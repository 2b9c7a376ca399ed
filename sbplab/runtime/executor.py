"""One rank's run: fire actors by the firing rule, comm in the plan's order, and record every firing.

The scheduler thread is the compute lane: it runs ready compute firings inline (by the firing rule's
priority, oldest step and micro-batch first; in a pipeline in the rank's schedule order), posts communication on the comm lane strictly in this rank's ``comm_order``,
and applies completions, which it collects itself (see ``lanes.CommLane``): when it has nothing
to compute it waits on the oldest communication in flight, so a message that arrives wakes the
thread that needs it and no other. Outputs live in registers until every consumer has acked them.
"""

from __future__ import annotations

import importlib
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..boxing.bucket_kernels import pack_bucket
from ..boxing.kinds import kernel_ref, kind_of
from .actor_plan import RankPlan
from .actors import FusedB, make_behaviour
from .buffers import BufferPools
from .comm import Comm
from .firing import MODES, PER_STEP, REG_FIRING, REG_NONE, SAME, FiringGraph, ReadyQueue
from .fusion import fuse_chains
from .lanes import CommFailure, CommLane
from .memory_peak import MemoryMeter
from .results import stack_values
from .specs import Accumulate, Collective, Recv, Sink, State

COMPUTE, COMM = 0, 1
PACK = kernel_ref(pack_bucket)


@dataclass
class RunSpec:
    """What the driver ships to one rank for one run."""

    run_id: int
    rank_plan: RankPlan
    micro_batches: int
    order: list[tuple[str, int]]  # this rank's comm firings of one step, in issue order
    steps: int
    feeds: dict[str, list[torch.Tensor]]
    groups: list[tuple[int, ...]]
    pairs: list[tuple[int, int]]
    timeout: float = 10.0
    want_params: bool = True
    trace: bool = True
    imports: tuple[str, ...] = ()
    report_steps: bool = False  # tell the driver as each step finishes (progress bars, on_step)
    fuse: bool = True  # fire chains of local compute actors as one (``fusion.py``)
    replicas: frozenset[str] = frozenset()  # States whose final value another rank sends (the same copy)
    resume: int | None = None  # start every keyed State from the worker's kept values of this tag
    keep: int | None = None  # after the run, the worker keeps every keyed State's final value under this tag


class ActorFailure(Exception):
    """A firing raised: carries where (rank, actor, op, firing) and the original traceback."""

    def __init__(self, rank: int, actor: str, op: str, k: int, tb: str) -> None:
        super().__init__(f"rank {rank}, actor {actor!r} ({op}), firing {k}")
        self.info = {"rank": rank, "actor": actor, "op": op, "firing": k, "traceback": tb}


StepReport = Callable[[int, dict[str, list[torch.Tensor]]], None]


def _pools(actors: list, device: torch.device) -> BufferPools:
    """The run's shared buffers (gradient buckets): made once, reused every step; one per register of
    the actor guarding each pool."""
    slots = [a.into for a in actors if getattr(a, "into", None) is not None]
    by_name = {a.name: a for a in actors} if slots else {}
    return BufferPools(slots, {s.pool: by_name[s.pool].registers for s in slots}, device)


class Executor:
    """``on_step(step, loss_values)`` is called on this thread as each step finishes on this rank, with
    the values of the step's "loss" sinks (sink name -> one tensor per firing of the step)."""

    def __init__(self, spec: RunSpec, rank: int, comm: Comm, device: torch.device, activity=None,
                 on_step: StepReport | None = None, resume: dict[str, torch.Tensor] | None = None) -> None:
        self.spec, self.rank, self.comm, self.device = spec, rank, comm, device
        self.on_step = on_step
        self.activity = activity  # shared ints the driver reads if this process dies
        rp = spec.rank_plan
        for mod in spec.imports:
            importlib.import_module(mod)
        # the actors this rank fires, and per actor the plan indices it runs (its parts, if fused):
        # traces and activity speak of plan actors
        if spec.fuse:
            self.actors, self.origin = fuse_chains(rp.actors)
        else:
            self.actors, self.origin = list(rp.actors), [[i] for i in range(len(rp.actors))]
        actors = self.actors
        self.graph = FiringGraph(actors, spec.micro_batches, spec.steps, rp.schedule)
        self.pools = _pools(rp.actors, device)
        if resume is not None:
            missing = [a.name for a in actors if isinstance(a, State) and a.key and a.name not in resume]
            if missing:
                raise RuntimeError(f"rank {rank}: the kept state has no value for States {missing[:5]}")
        self.behaviours = [make_behaviour(a, spec.micro_batches, spec.steps, device, spec.feeds, self.pools, resume)
                           for a in actors]
        self.fused = [b if isinstance(b, FusedB) else None for b in self.behaviours]
        # bytes held per category, peak kept (RunResult.memory); on CUDA the allocator's peak too
        self.meter = MemoryMeter(actors, self.origin, rp.actors, self.behaviours, self.pools.buffers, device)
        self.order = [(self.graph.names[n], m) for n, m in spec.order]
        # per actor, the registers it reads: (producer, output index, mode code)
        self.reads = [[(p, j, MODES[mode]) for p, j, mode in n.inputs] for n in self.graph.nodes]
        self.outs: list[dict[int, tuple]] = [dict() for _ in actors]
        self.events: list[dict[int, Any]] = [dict() for _ in actors]  # CUDA events per output
        self.pruned = [0] * len(actors)
        self.trace: list[tuple] = []
        self.cuda_timing: list[tuple] = []
        self.compute_inflight: tuple[int, int, int] | None = None  # (node, k, t0_ns)
        self.last_progress = time.perf_counter_ns()
        self.thread_id = threading.get_ident()
        self.streams = comm.communicator.streams()
        self.lane = CommLane(comm, self.streams, spec.micro_batches)
        self.stopped = False
        self.inplace = [self._may_overwrite_input(i) for i in range(len(actors))]
        # steps finished: node i has finished node_steps[i] steps; step_nodes[s] nodes have finished step s
        self.node_steps = [0] * len(actors)
        self.step_nodes = [0] * (spec.steps + 1)
        self.steps_reported = 0
        # read at every firing: kept as plain lists rather than asked of the actor specs each time
        self.n_outputs = [a.num_outputs for a in actors]
        self.tracing = spec.trace
        self.micro_scope = [a.scope == "micro" for a in actors]
        self.loss_sinks = [(a.name, b) for a, b in zip(actors, self.behaviours)
                           if isinstance(a, Sink) and a.key == "loss"]
        for b, origin in zip(self.fused, self.origin):
            if b is None:
                continue
            b.activity, b.origin = activity, origin
            if self.tracing:  # a mark around every part: one trace event each
                b.marks = []
                b.clock = lambda: self.streams.mark(self.streams.compute)

    def _may_overwrite_input(self, i: int) -> bool:
        """A collective whose kind allows it (all-reduce) may work in place on a register only it reads,
        made fresh by its producer.

        Accumulate buffers, received tensors and packed gradient buckets are fresh; any other compute
        kernel may return a view of a parameter (a reshape, an identity), so its outputs are copied first.
        """
        node = self.graph.nodes[i]
        a = node.actor
        if not isinstance(a, Collective) or not kind_of(a.kind_).in_place_ok or len(node.inputs) != 1:
            return False
        prod = self.graph.nodes[node.inputs[0][0]]
        fresh = isinstance(prod.actor, (Accumulate, Recv, Collective)) or getattr(prod.actor, "op", "") == PACK
        return fresh and prod.needed_acks == 1

    # --- registers --------------------------------------------------------------------------------
    def _inputs(self, i: int, k: int) -> tuple[list[torch.Tensor], list]:
        """The tensors firing k reads (``FiringGraph.in_number``, inlined), and (CUDA) their producers'
        events."""
        xs, evs = [], []
        outs, events, micro = self.outs, self.events, self.graph.micro
        for p, j, mode in self.reads[i]:
            if mode == SAME:
                o = k
            elif mode == PER_STEP:
                o = k // micro
            elif k >= 1:
                o = k - 1
            else:
                continue
            xs.append(outs[p][o][j])
            evs.append(events[p].get(o))  # None off CUDA
        return xs, evs

    def _store(self, i: int, k: int, outs: tuple | None, ev: Any) -> list[int]:
        g = self.graph
        node = g.nodes[i]
        reg = node.reg
        o = k if reg == REG_FIRING else None if reg == REG_NONE else g.out_number(node, k)
        if o is not None:
            if outs is None or len(outs) != self.n_outputs[i]:
                raise RuntimeError(f"actor {node.actor.name!r} produced no output for firing {k}")
            self.outs[i][o] = outs
            self.meter.stored(i, outs)
            if ev is not None:
                self.events[i][o] = ev
        touched = g.finish(i, k)
        s = node.done_upto // g.micro if self.micro_scope[i] else min(node.done_upto, g.steps)
        if s > self.node_steps[i]:
            for t in range(self.node_steps[i], s):
                self.step_nodes[t] += 1
            self.node_steps[i] = s
            self._report_steps()
        pruned, nodes = self.pruned, g.nodes
        for p in touched:
            released = nodes[p].released
            while pruned[p] < released:
                self.meter.freed(p, self.outs[p].pop(pruned[p], None))
                self.events[p].pop(pruned[p], None)
                pruned[p] += 1
        self.last_progress = time.perf_counter_ns()
        return touched

    def _report_steps(self) -> None:
        n, steps = len(self.graph.nodes), self.spec.steps
        while self.steps_reported < steps and self.step_nodes[self.steps_reported] == n:
            s = self.steps_reported
            self.steps_reported += 1
            if self.on_step is not None:
                per = self.graph.micro
                self.on_step(s, {name: b.values[s * per:(s + 1) * per] if b.actor.scope == "micro"  # type: ignore
                                 else b.values[s:s + 1] for name, b in self.loss_sinks})  # type: ignore

    # --- main loop ---------------------------------------------------------------------------------
    def run(self) -> dict:
        self.thread_id = threading.get_ident()
        self.streams.start_clock()
        self._report_steps()  # a rank without actors is done with every step at once
        try:
            self._loop()
        except CommFailure as e:
            a = self.graph.nodes[e.node].actor
            raise ActorFailure(self.rank, a.name, a.label, e.k, e.tb) from e
        return self._results()

    def _loop(self) -> None:
        g, spec, lane = self.graph, self.spec, self.lane
        ready = ReadyQueue(g)  # the compute lane's choice; the comm lane's firings are posted in order below
        nodes, can_fire, consider = g.nodes, g.can_fire, ready.offer
        for i in range(len(g.nodes)):
            consider(i)
        cstep, cpos = 0, 0
        order, steps = self.order, (spec.steps if self.order else 0)
        while g.unfinished:
            if self.stopped:
                raise RuntimeError("run stopped by the driver")
            while cstep < steps:  # communication, strictly in order
                i, m = order[cpos]
                n = nodes[i]
                if not can_fire(i):
                    break
                k = g.start(i)
                x, evs = self._inputs(i, k)
                if self.activity is not None:
                    self.activity[2], self.activity[3] = self.origin[i][0] + 1, k
                lane.post(i, k, n.actor, m, x[0] if x else None, evs[0] if evs else None, self.inplace[i])
                cpos += 1
                if cpos == len(order):
                    cpos, cstep = 0, cstep + 1
            done = lane.ready() if lane.pollable else None
            if done:  # completions first: they may let more communication go out
                for c in done:
                    self._complete(c, consider)
            elif ready:
                i = ready.take()
                for t in self._fire_compute(i):
                    consider(t)
            elif lane.busy:  # nothing to compute: wait where the next progress must come from
                self._complete(lane.wait_oldest(), consider)
            else:
                stuck = [f"{n.actor.name!r} firing {n.started} waits for {g.waiting_for(n.index)}"
                         for n in g.nodes if n.started == n.done_upto < n.total][:6]
                raise RuntimeError(f"rank {self.rank} cannot go on: nothing to compute and no communication "
                                   f"in flight; " + "; ".join(stuck))

    def _complete(self, c: tuple, consider) -> None:
        i, k, outs, ev, t0, t1, nbytes, timing = c
        if self.spec.trace:
            self.trace.append((self.origin[i][0], k, COMM, t0, t1, nbytes))
            if timing is not None:
                self.cuda_timing.append((len(self.trace) - 1,) + timing)
        for t in self._store(i, k, outs, ev):
            consider(t)

    def _fire_compute(self, i: int) -> list[int]:
        g = self.graph
        k = g.start(i)
        b = self.behaviours[i]
        xs, evs = self._inputs(i, k)
        if self.activity is not None:
            self.activity[0], self.activity[1] = self.origin[i][0] + 1, k
        t0 = time.perf_counter_ns()
        self.compute_inflight = (i, k, t0)
        st = self.streams
        try:  # on CUDA after its inputs' events, on the compute stream; (None, outputs, None) on CPU
            sev, outs, ev = st.run_on(st.compute, evs, xs, lambda: b.fire(k, xs))  # type: ignore[union-attr]
        except BaseException as e:  # noqa: BLE001
            a = g.nodes[i].actor
            fb = self.fused[i]
            if fb is not None:  # name the part that failed
                a = a.parts[fb.at]  # type: ignore[attr-defined]
            raise ActorFailure(self.rank, a.name, a.label, k, traceback.format_exc()) from e
        t1 = time.perf_counter_ns()
        self.compute_inflight = None
        if self.tracing:
            fb = self.fused[i]
            if fb is not None:
                self._trace_parts(i, k, fb.marks)  # type: ignore[arg-type]
            else:
                st.log(self.trace, self.cuda_timing, (self.origin[i][0], k, COMPUTE),
                       t0 if sev is None else sev, t1 if ev is None else ev)
        return self._store(i, k, outs, ev)

    def _trace_parts(self, i: int, k: int, marks: list) -> None:
        """One event per part of a fused firing, between the marks its behaviour took (CUDA: events)."""
        for n, p in enumerate(self.origin[i]):
            self.streams.log(self.trace, self.cuda_timing, (p, k, COMPUTE), marks[n], marks[n + 1])
        marks.clear()

    # --- what goes back to the driver --------------------------------------------------------------
    def steps_done(self) -> int:
        """Steps every actor of this rank has finished."""
        return self.steps_reported

    def _results(self) -> dict:
        self.streams.resolve(self.trace, self.cuda_timing)
        sinks, params = {}, {}
        for a, b in zip(self.actors, self.behaviours):
            if isinstance(a, Sink):
                sinks[a.name] = stack_values(b.values)  # type: ignore[union-attr]
            elif isinstance(a, State) and self.spec.want_params and a.key and a.name not in self.spec.replicas:
                params[a.name] = b.value.detach().to("cpu", copy=True)  # type: ignore[union-attr]
        out = {"sinks": sinks, "params": params, "trace": self.trace, "memory": self.meter.result()}
        if self.spec.keep is not None:  # for the worker, not the driver: the values themselves, where they are
            out["kept"] = {a.name: b.value for a, b in zip(self.actors, self.behaviours)  # type: ignore[union-attr]
                           if isinstance(a, State) and a.key}
        return out

    def status(self) -> list[dict]:
        """What this rank is doing now: firings in flight, else what blocked actors wait for."""
        now = time.perf_counter_ns()
        out: list[dict] = []
        ci = self.compute_inflight
        if ci is not None:
            a = self.graph.nodes[ci[0]].actor
            sec = (now - ci[2]) / 1e9
            out.append({"what": "compute", "actor": a.name, "op": a.label, "firing": ci[1], "seconds": sec,
                        "text": f"compute lane runs {a.name!r} ({a.label}) firing {ci[1]} for {sec:.1f} s"})
        with self.lane.lock:
            inflight = list(self.lane.inflight.items())
        for (i, k), (t0, label) in inflight:
            a = self.graph.nodes[i].actor
            sec = (now - t0) / 1e9
            out.append({"what": "comm", "actor": a.name, "op": label, "firing": k, "seconds": sec,
                        "text": f"comm lane waits in {a.name!r} ({label}) firing {k} for {sec:.1f} s"})
        if not out:
            g = self.graph
            for n in g.nodes:
                if n.started == n.done_upto < n.total and len(out) < 6:
                    why = g.waiting_for(n.index)
                    out.append({"what": "blocked", "actor": None, "op": None,
                                "text": f"{n.actor.name!r} firing {n.started} waits for {why}"})
        return out or [{"what": "idle", "actor": None, "op": None, "text": "idle"}]

    def progress_age_s(self) -> float:
        """Seconds since this rank last finished a firing."""
        return (time.perf_counter_ns() - self.last_progress) / 1e9
