"""The driver side of a cluster: workers joining, runs, progress, and turning failures into errors.

While a run goes, the driver waits on every worker's connection and process at once. A worker
error comes back as a message with its traceback; a dead worker shows as a closed connection or
an ended process; a hang shows as heartbeats in which no rank has finished a firing for
``timeout`` seconds. In the last two cases the driver asks the surviving workers what they are
doing, so the error says which actor waits for what.

The error blames the rank where the failure began, not the ranks that felt it (``diagnose``): a
collective that fails on one rank is held for a moment in case a peer died (its closed connections
are what failed the collective); in a hang, a stopped process (SIGSTOP) or a rank that does not
answer comes before one inside a kernel, and that before ranks waiting in collectives. A worker that
does not answer the clock pings before a run (stopped while idle) ends that run at once.

A worker that dies without a word on its connection (a C++ abort inside Gloo, a segfault) often said why
on stderr only: a spawned worker's last stderr lines are quoted in the error (``spawn``). A cluster
closed from another thread while a run goes makes that run end with a ClusterError that says so.

Between runs nothing should arrive from a worker: a readable connection (end of file: the worker was
OOM-killed or interrupted) or an ended process makes the driver unhealthy, so the next run starts
fresh workers instead of failing on a broken pipe.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from ..errors import ClusterError, InputError, InputTypeError
from .actor_plan import ActorPlan
from .diagnose import exit_text, process_state, stopped_text
from .executor import RunSpec
from .faults import RunError, describe_failure
from .progress import step_bar
from .results import Batches, RunResult, assemble_results, cut_feeds, loss_value, replica_sources, step_loss
from .trace import build_trace
from .wire import recv, send

PEER_DEATH_GRACE_S = 1.0  # after a rank's communication fails, how long to look for a peer that died
STDERR_LINES_QUOTED = 12  # of a dead worker's stderr, in the error
# the two ClusterErrors of a cluster used from two threads (docs/errors.md shows them)
BUSY_MESSAGE = ("this LocalCluster is busy: another run is going on it (from another thread, or from on_step); "
                "wait for it to finish, or use a second LocalCluster")
CLOSED_DURING_RUN_MESSAGE = ("the run was stopped because the cluster was closed (close() was called, from another "
                             "thread, while it ran); create a new LocalCluster to run again")


@dataclass
class RunOptions:
    """How ``LocalCluster.run`` runs; checked here, before any worker is asked to do anything."""

    steps: int = 1  # training steps, >= 1
    timeout: float = 10.0  # seconds without any rank finishing a firing before the run counts as hung, > 0
    progress: bool = False
    params: bool = True
    trace: bool = True
    on_step: Callable[[int, int, float | None], None] | None = None
    fuse: bool = True  # fire chains of local compute actors as one (``fusion.py``)
    state: bool = False  # send every keyed State's final shard back even without params (``carry.py``)
    resume: int | None = None  # the workers start every keyed State from the values they keep under this tag
    keep: int | None = None  # the workers keep every keyed State's final value under this tag

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int):
            raise InputTypeError(f"run: steps must be an int >= 1, got {self.steps!r}")
        if self.steps < 1:
            raise InputError(f"run: steps must be >= 1 (the number of training steps to run), got {self.steps}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)):
            raise InputTypeError(f"run: timeout must be a number of seconds, got {self.timeout!r}")
        if not self.timeout > 0:  # also refuses nan
            raise InputError(f"run: timeout must be > 0 seconds (how long no rank may finish a firing before the "
                             f"run counts as hung; 10 by default), got {self.timeout}")
        if self.on_step is not None and not callable(self.on_step):
            raise InputTypeError(f"on_step must be a function (step, steps, loss), got {type(self.on_step).__name__}")


class Driver:
    """Talks to ``n`` joined workers. incoming: authenticated ``(Connection, hello)`` pairs (``Acceptor``);
    procs: spawned ``WorkerProcess``es (empty for external workers); activity: per-rank activity slots."""

    def __init__(self, address: tuple[str, int] | str, incoming: queue.SimpleQueue, n: int, device_type: str,
                 init_method: str, threads: int, procs: list, activity: list, *, store_path: str | None = None,
                 auth_report: Callable[[], str] | None = None) -> None:
        """init_method: "file" (spawned workers meet in the FileStore at ``store_path``) or a torch
        init_method such as "env://" (torchrun). auth_report: failed authentications in words."""
        self.address, self.incoming, self.n, self.device_type = address, incoming, n, device_type
        self.init_method, self.threads, self.procs, self.activity = init_method, threads, procs, activity
        self.store_path, self.auth_report = store_path, auth_report
        self.closing = False  # close() was called (maybe from another thread): failures read as that
        self.conns: dict[int, Connection] = {}
        self.info: dict[int, dict] = {}
        self._healthy = False
        self._busy = False  # a run is going: its messages are the run's, not signs of a dead worker
        self.run_id = 0
        self.plan: ActorPlan | None = None

    @property
    def healthy(self) -> bool:
        """Joined and in step. While idle, also checks that no worker has ended since the last run."""
        if self._healthy and not self._busy and not self._idle_ok():
            self._healthy = False
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        self._healthy = value

    def _idle_ok(self) -> bool:
        if any(not p.is_alive() for p in self.procs):
            return False
        try:  # an idle worker sends nothing: anything readable is an end of file (or out of step)
            return not any(c.poll(0) for c in self.conns.values())
        except (OSError, ValueError):
            return False

    # --- joining ------------------------------------------------------------------------------------
    def connect(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        mine = {p.pid for p in self.procs}
        pending: list[tuple[Connection, dict]] = []
        while len(pending) < self.n:
            self._check_procs("while starting")
            if time.monotonic() > deadline:
                auth = self.auth_report() if self.auth_report is not None else ""
                raise RunError("setup", f"only {len(pending)} of {self.n} workers joined within "
                                        f"{timeout:.0f} s (driver at {self.address})" + (f": {auth}" if auth else ""))
            try:
                conn, hello = self.incoming.get(timeout=0.2)
            except queue.Empty:
                continue
            if mine and hello.get("pid") not in mine:
                conn.close()  # a worker of an earlier start, killed since
                continue
            pending.append((conn, hello))
        free = [r for r in range(self.n) if r not in {h["rank"] for _, h in pending}]
        for conn, hello in pending:
            r = hello["rank"] if 0 <= hello["rank"] < self.n else free.pop(0)
            if r in self.conns:
                raise RunError("setup", f"two workers claim rank {r}")
            if hello.get("world_size") and hello["world_size"] != self.n:
                raise RunError("setup", f"a worker was launched for world size {hello['world_size']}, "
                                        f"but the cluster has {self.n} ranks")
            self.conns[r], self.info[r] = conn, hello
        for r in self.conns:
            send(self.conns[r], ("init", {"rank": r, "world_size": self.n, "init_method": self.init_method,
                                          "device_type": self.device_type, "threads": self.threads,
                                          "local_rank": self.info[r].get("local_rank", 0),
                                          "store_path": self.store_path}))
        ready: set[int] = set()
        while len(ready) < self.n:
            left = deadline - time.monotonic()
            self._check_procs("while initialising torch.distributed")
            if left <= 0:
                raise RunError("setup", f"ranks {sorted(set(self.conns) - ready)} did not finish "
                                        f"init_process_group in time")
            for conn in wait([c for r, c in self.conns.items() if r not in ready], timeout=min(left, 0.2)):
                r = next(k for k, c in self.conns.items() if c is conn)
                msg = recv(conn)
                if msg[0] == "init_error":
                    raise RunError("setup", f"rank {r} failed to join the process group", r,
                                   worker_traceback=msg[2])
                ready.add(r)
        self.healthy = True

    def _check_procs(self, when: str) -> None:
        for r, p in enumerate(self.procs):
            if not p.is_alive():
                auth = self.auth_report() if self.auth_report is not None else ""
                raise RunError("setup", f"worker rank {r} exited with code {p.exitcode} {when}"
                                        + (f" ({auth})" if auth else "") + self._last_words(r), r)

    def _last_words(self, r: int) -> str:
        """What spawned rank ``r`` last wrote to stderr (the cause of a C++ abort is only there), as an
        indented block for a message; "" for external workers or a silent one."""
        p = self.procs[r] if r < len(self.procs) else None
        tail = p.stderr_tail() if p is not None and hasattr(p, "stderr_tail") else ""
        lines = [ln for ln in tail.strip().splitlines() if ln.strip()][-STDERR_LINES_QUOTED:]
        if not lines:
            return ""
        return "\n  its last words on stderr:\n" + "\n".join(f"    {ln}" for ln in lines)

    # --- clocks ------------------------------------------------------------------------------------
    def offsets(self, pings: int = 5, timeout: float = 10.0) -> dict[int, int]:
        """Worker clock minus driver clock (ns), from the ping with the shortest round trip. An idle worker
        answers at once; one that does not within ``timeout`` (stopped, wedged) ends the run here."""
        out = {}
        for r, conn in self.conns.items():
            best = None
            for _ in range(pings):
                t0 = time.perf_counter_ns()
                send(conn, ("clock",))
                if not self._answers(r, conn, timeout):
                    self.healthy = False
                    why = stopped_text(self._state(r)) or f"did not answer a clock ping within {timeout:.1f} s"
                    raise RunError("hang", f"worker rank {r} (pid {self.info.get(r, {}).get('pid')}) {why}; "
                                           f"the run could not begin", r)
                msg = recv(conn)
                t1 = time.perf_counter_ns()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, msg[1] - (t0 + t1) // 2)
            out[r] = best[1]  # type: ignore[index]
        return out

    def _answers(self, r: int, conn: Connection, timeout: float) -> bool:
        """Whether rank ``r`` has something to read within ``timeout`` s; False at once if it is stopped."""
        deadline = time.monotonic() + timeout
        while not conn.poll(min(0.25, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or stopped_text(self._state(r)):
                return False
        return True

    # --- a run --------------------------------------------------------------------------------------
    def run(self, plan: ActorPlan, batches: Batches | None, opts: RunOptions) -> RunResult:
        self._busy = True
        try:
            return self._run(plan, batches, opts)
        except (EOFError, OSError, ValueError, RunError) as e:
            self.healthy = False
            if self.closing:  # close() from another thread took the workers away: not a crash
                raise ClusterError(CLOSED_DURING_RUN_MESSAGE) from e
            if isinstance(e, (EOFError, OSError)):  # a worker went away before the run got going (pings, specs)
                for r, p in enumerate(self.procs):  # a spawned one that died: its exit code and last words
                    p.join(timeout=0.5)
                    if not p.is_alive():
                        self._died(r, plan)
                raise RunError("died", f"a worker's connection broke at the start of the run: {e!r}") from e
            raise
        finally:
            self._busy = False

    def _run(self, plan: ActorPlan, batches: Batches | None, opts: RunOptions) -> RunResult:
        steps = opts.steps
        feeds = _detached(cut_feeds(plan, batches, steps))
        offsets = self.offsets(timeout=opts.timeout)
        self.run_id += 1
        self.plan = plan
        groups, pairs = plan.groups(), plan.pairs()
        want_params = opts.params or opts.state
        copies = replica_sources(plan) if want_params else {}  # one copy of each replicated State comes back
        report = opts.progress or opts.on_step is not None
        t_start = time.perf_counter_ns()
        for r, conn in self.conns.items():
            spec = RunSpec(self.run_id, plan.ranks[r], plan.micro_batches, plan.rank_order(r), steps,
                           feeds[r], groups, pairs, opts.timeout, want_params, opts.trace, plan.imports, report,
                           opts.fuse, frozenset(n for q, n in copies if q == r), opts.resume, opts.keep)
            send(conn, ("run", spec))
        bar = step_bar(steps, opts.progress, desc=plan.name)
        results: dict[int, dict] = {}
        now = time.monotonic()
        last_progress = {r: now for r in self.conns}
        last_beat = {r: now for r in self.conns}
        steps_seen = {r: 0 for r in self.conns}
        step_values: dict[int, dict[int, dict]] = {}  # step -> rank -> that rank's loss sink values
        shown = 0

        def show(upto: int, losses: list[float] | None = None) -> None:
            """Steps shown..upto-1 finished on every rank: the bar moves and on_step hears of each."""
            nonlocal shown
            while shown < upto:
                s = shown
                if losses is not None:  # the run is over: its own losses (same values)
                    loss = losses[s] if s < len(losses) else None
                else:
                    loss = step_loss(plan, step_values.pop(s, {}))
                shown += 1
                if loss is not None:
                    bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
                bar.update(1)
                if opts.on_step is not None:
                    opts.on_step(s, steps, loss)

        by_conn = {c: r for r, c in self.conns.items()}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self.procs) if p.sentinel is not None}
        try:
            try:
                while len(results) < self.n:
                    for obj in wait(list(by_conn) + list(by_sentinel), timeout=0.1):
                        if obj in by_sentinel:
                            self._died(by_sentinel[obj], plan)
                        r = by_conn[obj]
                        try:
                            msg = recv(obj)
                        except (EOFError, OSError):
                            self._died(r, plan)
                        now = time.monotonic()
                        last_beat[r] = now
                        if msg[0] == "beat" and msg[1] == self.run_id:
                            last_progress[r] = now - msg[4]
                        elif msg[0] == "step" and msg[1] == self.run_id:
                            steps_seen[r] = max(steps_seen[r], msg[3] + 1)
                            step_values.setdefault(msg[3], {})[r] = msg[4]
                        elif msg[0] == "done" and msg[1] == self.run_id:
                            results[r] = msg[3]
                            steps_seen[r] = steps
                        elif msg[0] == "error" and msg[1] == self.run_id:
                            self.healthy = False
                            self._failed(r, msg[2], plan, by_conn, by_sentinel)
                    if report:
                        show(min(steps_seen.values()))
                    now = time.monotonic()
                    active = [r for r in self.conns if r not in results]
                    if active and now - max(last_progress[r] for r in active) > opts.timeout:
                        self._hang(plan, opts.timeout, f"no rank finished a firing for {opts.timeout:.1f} s")
                    silent = [r for r in active if now - last_beat[r] > opts.timeout + 5]
                    if silent:
                        self._hang(plan, opts.timeout,
                                   f"rank {silent[0]} stopped answering for {opts.timeout + 5:.0f} s")
            except BaseException:
                self.healthy = False
                raise
            wall = (time.perf_counter_ns() - t_start) / 1e9
            for (r, name), (q, src) in copies.items():
                results[r]["params"][name] = results[q]["params"][src]
            outputs, params = assemble_results(plan, steps, results, params=opts.params)
            losses = [loss_value(v) for v in outputs.get("loss", [])]
            show(steps, losses)  # every step is reported once, even if a report went missing
        finally:
            bar.close()
        trace = build_trace(plan, steps, {r: res["trace"] for r, res in results.items()}, offsets, t_start) \
            if opts.trace else None
        res = RunResult(losses, outputs, params, steps=steps, wall_s=wall)
        res.memory = {r: got["memory"] for r, got in results.items() if "memory" in got}
        if opts.state:
            res.final_shards = {r: got["params"] for r, got in results.items()}
        if trace is not None:
            res.trace = trace
        return res

    # --- failures -------------------------------------------------------------------------------------
    def _statuses(self, skip: set[int]) -> dict[int, list[dict]]:
        asked = {}
        for r, c in self.conns.items():
            if r in skip:
                continue
            try:
                send(c, ("status",))
                asked[r] = c
            except OSError:
                continue
        out: dict[int, list[dict]] = {}
        deadline = time.monotonic() + 2.0
        while asked and time.monotonic() < deadline:
            for c in wait(list(asked.values()), timeout=0.1):
                r = next(k for k, v in asked.items() if v is c)
                try:
                    msg = recv(c)
                except (EOFError, OSError):
                    asked.pop(r)
                    continue
                if msg[0] == "status":
                    out[r] = msg[2]
                    asked.pop(r)
        return out

    def _failed(self, r: int, info: dict, plan: ActorPlan, by_conn: dict, by_sentinel: dict) -> None:
        """Rank ``r`` reports that a firing raised. A failed communication is often the echo of a peer
        that died (its Gloo connections closed): if another rank ends within a moment, blame that one."""
        actor = plan.ranks[r].by_name.get(info.get("actor") or "") if r in plan.ranks else None
        grace = PEER_DEATH_GRACE_S if actor is not None and actor.lane == "comm" else 0.0  # else: look once
        dead = self._peer_death(r, by_conn, by_sentinel, grace)
        if dead is not None:
            self._died(dead, plan, echo=(r, info))
        raise describe_failure(info)

    def _peer_death(self, r: int, by_conn: dict, by_sentinel: dict, grace_s: float) -> int | None:
        """A rank other than ``r`` whose process ends or whose connection closes within ``grace_s``."""
        deadline = time.monotonic() + grace_s
        while True:
            for q, p in enumerate(self.procs):
                if q != r and not p.is_alive():
                    return q
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            others = [o for o, q in list(by_conn.items()) + list(by_sentinel.items()) if q != r]
            for obj in wait(others, timeout=min(left, 0.1)):
                if obj in by_sentinel:
                    return by_sentinel[obj]
                try:
                    recv(obj)  # a heartbeat or a report of its own: the run is over anyway
                except (EOFError, OSError):
                    return by_conn[obj]

    def _state(self, r: int) -> str | None:
        """Rank ``r``'s process state (``process_state``); known for spawned workers only (an external
        worker's pid may be another machine's)."""
        return process_state(self.procs[r].pid) if r < len(self.procs) else None

    def _last_activity(self, r: int, plan: ActorPlan) -> tuple[str | None, str | None, str]:
        """(actor, op, words) of rank ``r``'s last firings, read from its activity slots."""
        actor = op = None
        where = ""
        if r < len(self.activity) and r in plan.ranks:
            act = self.activity[r]
            actors = plan.ranks[r].actors
            if act[0] > 0:
                a = actors[act[0] - 1]
                actor, op = a.name, a.label
                where = f"; its last compute firing was {a.name!r} ({a.label}) firing {act[1]}"
            if act[2] > 0:
                a = actors[act[2] - 1]
                where += f"; its last communication was {a.name!r} ({a.label}) firing {act[3]}"
        return actor, op, where

    def _died(self, r: int, plan: ActorPlan, echo: tuple[int, dict] | None = None) -> None:
        self.healthy = False
        p = self.procs[r] if r < len(self.procs) else None
        if p is not None:
            p.join(timeout=1)
        code = f" with {exit_text(p.exitcode)}" if p else ""
        actor, op, where = self._last_activity(r, plan)
        status = self._statuses({r} | ({echo[0]} if echo else set()))
        lines = [f"worker rank {r} (pid {self.info.get(r, {}).get('pid')}) died{code} during the run{where}."
                 f"{self._last_words(r)}"]
        if echo is not None:
            q, info = echo
            tb = info.get("traceback", "").strip()
            lines.append(f"  rank {q}: its {info.get('actor') or 'run'!r} failed after that: "
                         f"{tb.splitlines()[-1] if tb else 'unknown error'}")
        lines += [f"  rank {q}: {s['text']}" for q, ss in sorted(status.items()) for s in ss]
        raise RunError("died", "\n".join(lines), r, actor, op, status=status)

    def _hang(self, plan: ActorPlan, timeout: float, why: str) -> None:
        """Blame, in this order: a rank whose process is stopped (SIGSTOP, a debugger), a rank that did
        not answer, a rank inside a compute firing, any rank inside a firing. A rank waiting in a
        collective is usually the victim of another one."""
        self.healthy = False
        stopped = [r for r in self.conns if stopped_text(self._state(r))]
        status = self._statuses(set(stopped))  # a stopped rank cannot answer: do not wait for it
        lines = [f"run of {plan.name!r} hung: {why}."]
        culprit = None
        tb = ""
        for r, ss in sorted(status.items()):
            for s in ss:
                lines.append(f"  rank {r}: {s['text']}")
                if s.get("stack"):
                    tb = s["stack"]
                if s.get("actor") and (culprit is None or s["what"] == "compute"):
                    culprit = (r, s)
        missing = sorted(set(self.conns) - set(status))
        if missing:
            for q in missing:
                text = stopped_text(self._state(q))
                _, _, where = self._last_activity(q, plan)
                lines.append(f"  rank {q} (pid {self.info.get(q, {}).get('pid')}) "
                             f"{text or 'did not answer'}{where}")
            q = (stopped or missing)[0]
            actor, op, _ = self._last_activity(q, plan)
            culprit = (q, {"actor": actor, "op": op})
            tb = ""  # a stack of another rank would point at a victim
        r, s = culprit if culprit else (None, {})
        raise RunError("hang", "\n".join(lines), r, s.get("actor"), s.get("op"), tb, status)

    # --- shutting down ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.closing = True
        for c in list(self.conns.values()):
            try:
                send(c, ("close",))
            except OSError:
                pass
        self.healthy = False

    def close_connections(self) -> None:
        for c in list(self.conns.values()):
            try:
                c.close()
            except OSError:
                pass
        self.conns = {}
        self.healthy = False



def _detached(feeds: dict[int, dict[str, list]]) -> dict[int, dict[str, list]]:
    """Feeds without autograd history: a batch made with ``requires_grad=True`` (or cut from one) is data
    to the workers, whose kernels write into preallocated outputs (``out=``), which autograd refuses.
    The same tensor stays one object, so a batch given once for every step is still shipped once."""
    memo: dict[int, object] = {}

    def plain(t):
        if getattr(t, "requires_grad", False):
            if id(t) not in memo:
                memo[id(t)] = t.detach()
            return memo[id(t)]
        return t

    return {r: {f: [plain(t) for t in ts] for f, ts in per.items()} for r, per in feeds.items()}
