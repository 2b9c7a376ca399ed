"""One rank's run: fire actors by the firing rule, comm in the plan's order, and record every firing.

The scheduler thread is the compute lane: it runs ready compute firings inline (oldest step and
micro-batch first), hands communication to the comm lane strictly in this rank's ``comm_order``,
and applies completions. Outputs live in registers until every consumer has acked them.
"""

from __future__ import annotations

import heapq
import importlib
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from .actors import make_behaviour
from .comm import Comm
from .firing import FiringGraph
from .lanes import CommLane, Streams
from .plan import RankPlan
from .specs import Accumulate, Collective, Recv, Sink, State

COMPUTE, COMM = 0, 1


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


class ActorFailure(Exception):
    """A firing raised: carries where (rank, actor, op, firing) and the original traceback."""

    def __init__(self, rank: int, actor: str, op: str, k: int, tb: str) -> None:
        super().__init__(f"rank {rank}, actor {actor!r} ({op}), firing {k}")
        self.info = {"rank": rank, "actor": actor, "op": op, "firing": k, "traceback": tb}


class Executor:
    def __init__(self, spec: RunSpec, rank: int, comm: Comm, device: torch.device, activity=None) -> None:
        self.spec, self.rank, self.comm, self.device = spec, rank, comm, device
        self.activity = activity  # shared ints the driver reads if this process dies
        rp = spec.rank_plan
        for mod in spec.imports:
            importlib.import_module(mod)
        self.graph = FiringGraph(rp.actors, spec.micro_batches, spec.steps)
        self.behaviours = [make_behaviour(a, spec.micro_batches, spec.steps, device, spec.feeds)
                           for a in rp.actors]
        self.order = [(self.graph.names[n], m) for n, m in spec.order]
        self.outs: list[dict[int, tuple]] = [dict() for _ in rp.actors]
        self.events: list[dict[int, Any]] = [dict() for _ in rp.actors]  # CUDA events per output
        self.pruned = [0] * len(rp.actors)
        self.trace: list[tuple] = []
        self.cuda_timing: list[tuple] = []
        self.compute_inflight: tuple[int, int, int] | None = None  # (node, k, t0_ns)
        self.last_progress = time.perf_counter_ns()
        self.thread_id = threading.get_ident()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.streams = Streams(device)
        self.lane = CommLane(comm, self.streams, self.inbox, spec.micro_batches)
        self.stopped = False
        self.inplace = [self._may_overwrite_input(i) for i in range(len(rp.actors))]

    def _may_overwrite_input(self, i: int) -> bool:
        """An all-reduce may work in place on a register only it reads, made fresh by its producer.

        Accumulate buffers and received tensors are fresh; a compute kernel may return a view of
        a parameter (a reshape, an identity), so its outputs are copied first.
        """
        node = self.graph.nodes[i]
        a = node.actor
        if not isinstance(a, Collective) or a.kind_ != "all_reduce" or len(node.inputs) != 1:
            return False
        prod = self.graph.nodes[node.inputs[0][0]]
        return isinstance(prod.actor, (Accumulate, Recv, Collective)) and prod.needed_acks == 1

    # --- registers --------------------------------------------------------------------------------
    def _inputs(self, i: int, k: int) -> tuple[list[torch.Tensor], list]:
        xs, evs = [], []
        g = self.graph
        for p, j, mode in g.nodes[i].inputs:
            o = g.in_number(mode, k)
            if o is None:
                continue
            xs.append(self.outs[p][o][j])
            evs.append(self.events[p].get(o))
        return xs, evs

    def _store(self, i: int, k: int, outs: tuple | None, ev: Any) -> list[int]:
        g = self.graph
        o = g.out_number(g.nodes[i], k)
        if o is not None:
            if outs is None or len(outs) != g.nodes[i].actor.num_outputs:
                raise RuntimeError(f"actor {g.nodes[i].actor.name!r} produced no output for firing {k}")
            self.outs[i][o] = outs
            if ev is not None:
                self.events[i][o] = ev
        touched = g.finish(i, k)
        for p in touched:
            n = g.nodes[p]
            while self.pruned[p] < n.released:
                self.outs[p].pop(self.pruned[p], None)
                self.events[p].pop(self.pruned[p], None)
                self.pruned[p] += 1
        self.last_progress = time.perf_counter_ns()
        return touched

    # --- main loop ---------------------------------------------------------------------------------
    def run(self) -> dict:
        self.thread_id = threading.get_ident()
        self.streams.start_clock()
        self.lane.start()
        try:
            self._loop()
        finally:
            self.lane.shutdown()
        return self._results()

    def _loop(self) -> None:
        g, spec = self.graph, self.spec
        ready: list[tuple[int, int, int]] = []
        queued = set()

        def consider(i: int) -> None:
            n = g.nodes[i]
            if i not in queued and n.actor.lane != "comm" and g.can_fire(i):
                k = n.started
                heapq.heappush(ready, (g.step_of(n, k), g.micro_of(n, k), i))
                queued.add(i)

        for i in range(len(g.nodes)):
            consider(i)
        cstep, cpos = 0, 0
        while not g.finished():
            if self.stopped:
                raise RuntimeError("run stopped by the driver")
            while cstep < spec.steps and self.order:  # communication, strictly in order
                i, m = self.order[cpos]
                n = g.nodes[i]
                if not g.can_fire(i):
                    break
                k = g.start(i)
                x, evs = self._inputs(i, k)
                if self.activity is not None:
                    self.activity[2], self.activity[3] = i + 1, k
                self.lane.submit(i, k, n.actor, m, x[0] if x else None, evs[0] if evs else None,
                                 self.inplace[i])
                cpos += 1
                if cpos == len(self.order):
                    cpos, cstep = 0, cstep + 1
            self._drain(consider, block=not ready)
            if ready:
                _, _, i = heapq.heappop(ready)
                queued.discard(i)
                for t in self._fire_compute(i):
                    consider(t)

    def _drain(self, consider, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if msg[0] == "error":
                _, i, k, exc, tb = msg
                a = self.graph.nodes[i].actor
                raise ActorFailure(self.rank, a.name, a.label, k, tb) from exc
            _, i, k, outs, ev, t0, t1, nbytes, timing = msg
            if self.spec.trace:
                self.trace.append((i, k, COMM, t0, t1, nbytes))
                if timing is not None:
                    self.cuda_timing.append((len(self.trace) - 1,) + timing)
            for t in self._store(i, k, outs, ev):
                consider(t)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _fire_compute(self, i: int) -> list[int]:
        g = self.graph
        k = g.start(i)
        b = self.behaviours[i]
        xs, evs = self._inputs(i, k)
        if self.activity is not None:
            self.activity[0], self.activity[1] = i + 1, k
        t0 = time.perf_counter_ns()
        self.compute_inflight = (i, k, t0)
        sev = ev = None
        try:
            with self.streams.use(self.streams.compute):
                self.streams.wait_for(self.streams.compute, evs)
                if self.streams.cuda:  # inputs made on the comm stream: keep their memory until used here
                    for x in xs:
                        x.record_stream(self.streams.compute)
                sev = self.streams.record(self.streams.compute)
                outs = b.fire(k, xs)  # type: ignore[union-attr]
                ev = self.streams.record(self.streams.compute)
        except BaseException as e:  # noqa: BLE001
            a = g.nodes[i].actor
            raise ActorFailure(self.rank, a.name, a.label, k, traceback.format_exc()) from e
        t1 = time.perf_counter_ns()
        self.compute_inflight = None
        if self.spec.trace:
            self.trace.append((i, k, COMPUTE, t0, t1, 0))
            if sev is not None:
                self.cuda_timing.append((len(self.trace) - 1, sev, ev))
        return self._store(i, k, outs, ev)

    # --- what goes back to the driver --------------------------------------------------------------
    def steps_done(self) -> int:
        g = self.graph
        done = g.steps
        for n in g.nodes:
            s = n.done_upto // g.micro if n.actor.scope == "micro" else min(n.done_upto, g.steps)
            done = min(done, s)
        return done

    def _results(self) -> dict:
        if self.streams.cuda:
            torch.cuda.synchronize()
            for idx, sev, eev in self.cuda_timing:
                i, k, lane, _, _, nb = self.trace[idx]
                self.trace[idx] = (i, k, lane, self.streams.to_ns(sev), self.streams.to_ns(eev), nb)
        sinks, params = {}, {}
        for a, b in zip(self.spec.rank_plan.actors, self.behaviours):
            if isinstance(a, Sink):
                sinks[a.name] = b.values  # type: ignore[union-attr]
            elif isinstance(a, State) and self.spec.want_params and a.key:
                params[a.name] = b.value.detach().to("cpu", copy=True)  # type: ignore[union-attr]
        return {"sinks": sinks, "params": params, "trace": self.trace}

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
