"""LocalCluster: persistent worker processes, one per rank, driven from a notebook or a script.

    with sl.LocalCluster(4) as cluster:           # 4 Gloo ranks on this machine
        result = cluster.run(step, (x, y), steps=3)  # a compiled step, or an ActorPlan and its batches
        more = cluster.run(step, (x, y), steps=3)    # steps 4..6: a compiled step's state stays here
        result.load_into(model)                      # the trained weights back into the torch module
        cluster.save(step, "ckpt")                   # a DCP checkpoint; cluster.load(step2, "ckpt") resumes

Trust: driver and workers exchange pickles, so whoever can talk to the driver with the token can run
code in the driver and in every worker. So every cluster has a random token (32 bytes from ``secrets``,
or ``token=``), checked both ways by an HMAC-SHA256 challenge (``handshake``, ``hmac.compare_digest``)
in a thread of its own per connection, bounded in time, size and per peer, before anything is unpickled.
A spawned cluster keeps everything in a private directory (mode 0700, deleted on close): the driver
listens on a Unix socket there and the workers meet in a ``FileStore`` there, so other local users reach
neither; only Gloo's pair listeners (loopback) stay on TCP (README, "Trust"). ``launch="external"``
(and a spawned cluster given ``host=``) listens on TCP, 127.0.0.1 unless ``host=`` names another
address, which also needs an explicit ``token=`` of at least 128 bits. Spawned workers get the token in
their environment, never on the command line. Workers of other machines join with
``SBPLAB_TOKEN=... torchrun ... -m sbplab.worker --driver HOST:PORT`` (``launch="external"``).

Spawned workers are fresh ``python -m sbplab.worker`` processes in their own process group: any driver
works (notebook, script, stdin, ``python -c``; no ``if __name__ == "__main__"`` guard needed) and a
Jupyter interrupt of the kernel does not reach them. A failed or interrupted run kills the workers (a
half-finished collective would leave the process groups out of step); a worker that died between runs
(OOM killer) turns ``alive`` False. Either way spawned workers come back on the next run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import functools
import ipaddress
import os
import queue
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ClusterError, InputError, InputTypeError
from .accept import Acceptor, listen_socket, listen_unix
from .activity import ActivityBoard
from .actor_plan import ActorPlan
from .carry import StateStore, with_state, without_inits
from .checkpoint import blocks_of, check_fits, checkpoint_path, exchange, initial_values
from .checkpoint_worker import CheckpointRequest
from .chunks import check_every, chunk_batches, merge_results
from .driver import BUSY_MESSAGE, CLOSED_DURING_RUN_MESSAGE, Driver, RunOptions
from .faults import RunError
from .progress import step_bar
from .results import RunResult
from .runnable import Runnable, plan_and_batches, ranks_needed
from .spawn import WorkerProcess, reap, spawn_worker
from .tokens import check_token_strength, new_token

MAX_SPAWN = 128  # worker processes LocalCluster starts on one machine; torchrun (launch="external") for more


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _one_run_at_a_time(run: Callable) -> Callable:
    """``run`` refuses a second caller while one is going (two threads, or ``on_step`` calling back): the
    workers follow one plan at a time. A run that ends because another thread closed the cluster says so."""
    @functools.wraps(run)
    def exclusive(self: LocalCluster, *args: Any, **kwargs: Any) -> Any:
        if not self._run_lock.acquire(blocking=False):
            raise ClusterError(BUSY_MESSAGE)
        try:
            return run(self, *args, **kwargs)
        except (ClusterError, KeyboardInterrupt):
            raise
        except BaseException as e:
            if self.closed:
                raise ClusterError(CLOSED_DURING_RUN_MESSAGE) from e
            raise
        finally:
            self._run_lock.release()
    return exclusive


class LocalCluster:
    """``n`` ranks of ``device_type`` ("cpu": Gloo; "cuda": NCCL with one GPU per rank).

    launch: "spawn" starts the workers here; "external" waits for ``n`` workers started elsewhere
        (torchrun) to connect to ``address``.
    host, port: where the driver listens on TCP (port 0: a free one). Not given: a spawned cluster listens
        on a Unix socket in its private directory, an external one on 127.0.0.1.
    token: shared secret (a str); required unless ``host`` is loopback, and then at least 128 bits
        (``secrets.token_urlsafe(32)``); random (``secrets``) if not given.
        ``cluster.token`` gives it to external workers ($SBPLAB_TOKEN or a chmod 600 ``--token-file``).
    threads: torch intra-op threads per worker (default: cores divided among the workers).
    start_timeout: seconds to wait for all workers to join.
    """

    def __init__(self, n: int, device_type: str = "cpu", *, launch: str = "spawn", host: str | None = None,
                 port: int = 0, token: str | None = None, threads: int | None = None,
                 start_timeout: float = 120.0) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise InputTypeError(f"LocalCluster(n): n is the number of ranks, an int >= 1; got {n!r}")
        if n < 1:
            raise InputError(f"a cluster needs at least one worker, got n={n}")
        if launch == "spawn" and n > MAX_SPAWN:
            raise InputError(f"LocalCluster({n}) would start {n} worker processes on this machine (each a Python "
                             f"process with torch); at most {MAX_SPAWN} are spawned. For more ranks start them on "
                             f"several machines with torchrun and LocalCluster(n, launch='external', ...)")
        if host is not None and not isinstance(host, str) or isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise InputError(f"host must be a str and port an int in 0..65535 (0: a free one), got host={host!r}, "
                             f"port={port!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InputError(f"threads must be an int >= 1 (torch threads per worker) or None, got {threads!r}")
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, (int, float)) or not start_timeout > 0:
            raise InputError(f"start_timeout must be a number of seconds > 0, got {start_timeout!r}")
        if device_type not in ("cpu", "cuda"):
            raise InputError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
        if launch not in ("spawn", "external"):
            raise InputError(f"launch must be 'spawn' or 'external', got {launch!r}")
        if token is not None and not isinstance(token, str):
            raise InputTypeError(f"token must be a str (workers read it from $SBPLAB_TOKEN), got {type(token).__name__}")
        if host is not None and not _is_loopback(host):
            if not token:
                raise InputError(f"listening on {host!r} (not loopback) needs a shared token=; workers pass the "
                                 f"same one as $SBPLAB_TOKEN")
            check_token_strength(token, host)
        if device_type == "cuda" and launch == "spawn":
            import torch

            have = torch.cuda.device_count()
            if have < n:
                raise InputError(f"{n} cuda ranks need {n} GPUs (one per rank); this machine has {have}")
        self.n, self.device_type, self.launch = n, device_type, launch
        self._token = token or new_token()
        self._threads = threads or max(1, (os.cpu_count() or 1) // n)
        self._start_timeout = start_timeout
        self._procs: list[WorkerProcess] = []
        self._board: ActivityBoard | None = None
        self._slots: list = []
        self.driver: Driver | None = None
        self.closed = False
        self._state = StateStore()  # per compiled step, the final shards its next run starts from
        self._held: tuple[Driver, int] | None = None  # the workers of that driver keep the state of that tag
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()  # (connection, hello) of joined workers
        self._starts = 0
        self._run_lock = threading.Lock()  # one run at a time: a second, from another thread, is refused
        # a spawned cluster's private directory (0700): the driver's Unix socket and the rendezvous store
        self._dir = tempfile.mkdtemp(prefix="sbplab-") if launch == "spawn" else None
        try:
            if host is None and self._dir is not None and hasattr(socket, "AF_UNIX"):
                server = listen_unix(os.path.join(self._dir, "driver.sock"), backlog=max(n, 8) + 8)
            else:
                server = _listen_tcp(host or "127.0.0.1", port, backlog=max(n, 8) + 8)
            self._acceptor = Acceptor(server, self._token.encode(), self._incoming)
        except BaseException:
            self._remove_dir()
            raise
        self.address: tuple[str, int] | str = self._acceptor.address
        if launch == "spawn":
            try:
                self._start()
            except BaseException:
                self.close()
                raise

    @property
    def token(self) -> str:
        """The shared secret workers must hold (keep it secret: it lets its holder run code here)."""
        return self._token

    # --- life cycle --------------------------------------------------------------------------------
    def _start(self) -> None:
        """Spawn ``n`` fresh workers and wait until they have joined and formed the process group."""
        if self._board is None:
            self._board = ActivityBoard.create(self.n)
            self._slots = self._board.slots()
        self._board.clear()
        try:
            for r in range(self.n):
                self._procs.append(spawn_worker(self.address, self._token, r, self._board.fd))
            self._starts += 1  # a fresh store file per start: nothing of an earlier start's keys is read
            store = os.path.join(self._dir, f"store-{self._starts}")  # type: ignore[arg-type]
            with contextlib.suppress(OSError):  # the last start's file, left by workers that were killed
                os.unlink(os.path.join(self._dir, f"store-{self._starts - 1}"))  # type: ignore[arg-type]
            self.driver = Driver(self.address, self._incoming, self.n, self.device_type, "file", self._threads,
                                 self._procs, self._slots, store_path=store, auth_report=self._acceptor.report)
            self.driver.connect(self._start_timeout)
        except BaseException:
            self._kill()
            self.driver = None
            raise

    def wait_ready(self, timeout: float | None = None) -> None:
        """External launch: block until all ``n`` workers have joined."""
        if self.driver is None:
            if self.launch == "spawn":
                self._start()
                return
            self.driver = Driver(self.address, self._incoming, self.n, self.device_type, "env://",
                                 self._threads, [], [], auth_report=self._acceptor.report)
            try:
                self.driver.connect(timeout or self._start_timeout)
            except BaseException:
                self.driver = None
                raise

    @property
    def alive(self) -> bool:
        """True while workers are up and in step: a failed run takes them down, and a worker that died
        since the last run (OOM killer, a signal) is noticed here; the next run starts fresh ones."""
        return self.driver is not None and self.driver.healthy

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @_one_run_at_a_time
    def run(self, step: ActorPlan | Runnable, inputs: Any = None, steps: int = 1, *, timeout: float = 10.0,
            progress: bool | None = None, params: bool = True, trace: bool = True,
            on_step: Callable[[int, int, float | None], None] | None = None, fuse: bool = True,
            restart: bool = False, checkpoint_every: int | None = None,
            checkpoint_dir: str | os.PathLike | None = None) -> RunResult:
        """Run ``steps`` training steps and return losses, final parameters and a trace.

        Runs of a compiled step continue: parameters and optimizer state stay with this cluster, so
        a second ``run(step, ...)`` starts where the last finished run of the same step stopped (two
        runs of 3 steps train like one run of 6). The first run of a step, and ``restart=True``,
        start from the weights captured at ``sl.compile``; ``reset(step)`` forgets the kept state.
        A failed or interrupted run leaves the state of the last run that finished (the driver keeps
        a copy, so it outlives workers respawned after a failure; the workers keep the final values
        of their last run too, so the next run of the same step on them ships none). Another compiled step, or
        the same step on another cluster, starts from its own compiled weights. An ActorPlan given
        directly starts from its States' ``init`` every run.

        step: an ActorPlan, or a compiled training step (``sl.compile(...)``; any ``Runnable``: it
            gives its plan for this cluster's ranks and checks its inputs).
        inputs: for an ActorPlan, the batches: one mapping feed -> global tensor per step (or one
            for every step, or a function of the step); sources cut their shards from it. For a
            compiled step, whatever its ``feeds`` takes: e.g. ``(idx, targets)`` in the order of
            ``step.graph.inputs``, a dict by input name, or a list of those (one per step).
        timeout: seconds without any rank finishing a firing before the run counts as hung.
        progress: a bar over steps (default: on when stderr is a terminal or in a notebook).
        on_step: ``on_step(step, steps, loss)`` is called here, in the driver, as each step finishes on
            every rank: once per step, in order, ``loss`` being that step's global loss (the value
            ``result.losses[step]`` will have), or None if the plan has no "loss" sink. The workers
            then send one small message per step. An exception raised by ``on_step`` ends ``run``
            with it (workers still busy with later steps are torn down, like after Ctrl-C).
        fuse: fire each chain of local compute actors (each the only reader of the one before) as one
            actor, without the bookkeeping between them (``runtime/fusion.py``); the trace still has
            every part. False runs every actor on its own.
        params: assemble the final global parameters and optimizer state into ``result.params``
            (``result.load_into(module)`` copies the parameters into a torch module). With False the
            workers still send their final shards back, for the next run to continue from.
        restart: start this compiled step again from its compiled weights instead of continuing.
        checkpoint_every: run a compiled step N steps at a time (the numbers are the same to the bit:
            runs continue exactly). After every N steps the driver holds that step's state, so a
            failure loses at most the N - 1 steps since; ``RunError.kept_step`` and its message say
            which step's state survived (``RunError.partial``: the result of the steps kept), and the
            next run continues from it. Without it, a failure
            keeps the state of the last run that finished.
        checkpoint_dir: also write the state every N steps (``checkpoint_every``; default: at the
            end of the run) to ``checkpoint_dir/step-<steps done, 8 digits>`` in DCP format
            (``save``); ``load(step, path)`` resumes from one, under this strategy or another.
        """
        if self.closed:
            raise ClusterError("this LocalCluster is closed; create a new one")
        if not isinstance(restart, bool):
            raise InputTypeError(f"run: restart must be True or False, got {restart!r}")
        carry = not isinstance(step, ActorPlan)  # a compiled step: its state stays here between runs
        every = check_every(checkpoint_every, checkpoint_dir, carry, steps)
        folder = checkpoint_path(checkpoint_dir, "run: checkpoint_dir") if checkpoint_dir is not None else None
        opts = RunOptions(steps=steps, timeout=timeout, progress=_interactive() if progress is None else progress,
                          params=params, trace=trace, on_step=on_step, fuse=fuse,
                          state=carry)  # checks them before any worker starts
        plan, batches = plan_and_batches(step, inputs, self.n)
        if plan.world_size > self.n:
            raise InputError(f"plan {plan.name!r} has {plan.world_size} ranks but this cluster has {self.n}")
        if plan.device_type is None:  # compiled device-free: it runs on this cluster's device
            plan = copy.copy(plan)
            plan.device_type = self.device_type
        elif plan.device_type != self.device_type:
            raise InputError(f"plan {plan.name!r} is for {plan.device_type} but this cluster runs "
                             f"{self.device_type}; compile it for {self.device_type!r} (device=...), or device-free "
                             f"(a preset, a search result or sl.Placement(None, ...), no device=) to run anywhere")
        self._ensure_workers()
        if plan.world_size < self.n:  # the extra workers idle (they still join new process groups)
            plan = ActorPlan(self.n, dict(plan.ranks), plan.device_type, plan.micro_batches, plan.comm_order,
                             plan.name, plan.imports)
        if not carry:
            return self._run_once(step, plan, batches, opts, restart, carry)
        if restart:
            self._state.drop(step)
        if every is None:
            result = self._run_kept(step, plan, batches, opts, None)
        else:
            result = self._run_chunks(step, plan, batches, opts, every, folder)
        if folder is not None and every is None:
            self._save(step, folder / f"step-{self._state.steps(step):08d}")
        return result

    def _run_chunks(self, step: Runnable, plan: ActorPlan, batches: Any, opts: RunOptions, every: int,
                    folder: Path | None) -> RunResult:
        """``opts.steps`` steps as runs of ``every`` steps (``chunks.py``): the driver keeps the state after
        each, and the workers write it to ``folder`` when given. One progress bar and one ``on_step`` count
        over the whole run."""
        steps, user = opts.steps, opts.on_step
        bar = step_bar(steps, opts.progress, desc=plan.name)
        parts: list[RunResult] = []
        try:
            for start in range(0, steps, every):
                n = min(every, steps - start)

                def report(s: int, _n: int, loss: float | None, start: int = start) -> None:
                    if loss is not None:
                        bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
                    bar.update(1)
                    if user is not None:
                        user(start + s, steps, loss)

                last = start + n == steps  # the global parameters are assembled for the result only
                chunk = dataclasses.replace(opts, steps=n, progress=False, on_step=report, params=opts.params and last)
                try:
                    parts.append(self._run_kept(step, plan, chunk_batches(batches, start, n), chunk, folder))
                except RunError as e:
                    e.partial = merge_results(parts, plan.micro_batches) if parts else None  # type: ignore
                    raise
                if folder is not None:
                    self._save(step, folder / f"step-{self._state.steps(step):08d}")
        finally:
            bar.close()
        return merge_results(parts, plan.micro_batches)

    def _run_kept(self, step: Runnable, plan: ActorPlan, batches: Any, opts: RunOptions,
                  folder: Path | None) -> RunResult:
        """One run of a compiled step from its kept state; a RunError says which step's state survived."""
        try:
            return self._run_once(step, plan, batches, opts, False, True)
        except RunError as e:
            done = self._state.steps(step)
            if step not in self._state:
                e.keep_note(0, "Nothing was kept: the next run of this step starts from its compiled weights.")
            else:
                disk = f"; on disk at {str(folder / f'step-{done:08d}')!r}" if (
                    folder is not None and (folder / f"step-{done:08d}" / ".metadata").is_file()) else ""
                e.keep_note(done, f"The state after step {done} is kept (on the driver{disk}); the next run of "
                                  f"this step continues from it (restart=True starts over).")
            raise

    def _run_once(self, step: ActorPlan | Runnable, plan: ActorPlan, batches: Any, opts: RunOptions,
                  restart: bool, carry: bool) -> RunResult:
        held, self._held = self._held, None  # what the workers keep: this run starts from it or drops it
        self._ensure_workers()  # between chunks of a run too: a worker that died after its chunk is replaced
        if carry:
            if restart:
                self._state.drop(step)
            kept, tag = self._state.get(step), self._state.tag(step)
            if kept is not None and held is not None and held[0] is self.driver and held[1] == tag:
                plan, opts.resume = without_inits(plan), tag  # the same workers keep it: ship nothing
            elif kept is not None:
                plan = with_state(plan, kept)  # fresh workers, or another step ran since: ship the spare
            opts.keep = self._state.new_tag()
        try:
            result = self.driver.run(plan, batches, opts)  # type: ignore[union-attr]
        except BaseException:
            if not self.driver.healthy:  # type: ignore[union-attr]
                self._kill()
            raise
        if carry:
            done = self._state.steps(step) + opts.steps
            self._state.put(step, result.final_shards, opts.keep, done)  # type: ignore[arg-type]
            self._held = (self.driver, opts.keep)
        return result

    # --- checkpoints -------------------------------------------------------------------------------
    @_one_run_at_a_time
    def save(self, step: Runnable, path: str | os.PathLike, *, timeout: float = 600.0) -> Path:
        """Write ``step``'s training state here (parameters and optimizer state, as its next run would
        start from them: after its last finished run, else its compiled weights) to the folder ``path``
        in torch.distributed.checkpoint (DCP) format; returns the folder.

        Each worker writes its own blocks (replicated ones once, as DCP plans them) under logical names:
        the module's parameter names and ``"<param>.<optimizer state>"`` (``result.params``' keys), and
        ``"sbplab.steps"``, the steps done. So ``load`` reads it back under this strategy or another, and
        a plain torch module reads it without any process group (``sbplab.runtime.checkpoint
        .load_checkpoint(module, path)``, or DCP itself). A folder holding a checkpoint is overwritten.
        """
        return self._save(step, path, timeout)

    def _save(self, step: Runnable, path: str | os.PathLike, timeout: float = 600.0) -> Path:
        plan, where = self._checkpoint_plan(step, "save"), checkpoint_path(path, "save")
        self._ensure_workers()  # first: fresh workers keep nothing, so the driver's copy goes to them
        where.mkdir(parents=True, exist_ok=True)
        blocks, done = blocks_of(plan), self._state.steps(step)
        kept, tag = self._state.get(step), self._state.tag(step)
        same = kept is not None and self._held is not None and self._held == (self.driver, tag)
        values = None if same else (kept if kept is not None else initial_values(plan))
        reqs = {r: CheckpointRequest("save", str(where), blocks.get(r, []), tag if same else None,
                                     None if values is None else values.get(r, {}), done) for r in range(self.n)}
        self._checkpoint_exchange(reqs, timeout, f"saving {plan.name!r} to {str(where)!r}")
        return where

    @_one_run_at_a_time
    def load(self, step: Runnable, path: str | os.PathLike, *, timeout: float = 600.0) -> int:
        """Make ``step``'s next run start from the checkpoint in the folder ``path`` (written by ``save``
        or ``run(..., checkpoint_dir=...)``, under any strategy): each worker reads the blocks its ranks
        hold under this step's strategy (DCP reshards on read) and keeps them; the driver keeps a copy
        for fresh workers. Returns the steps done when it was written. Names and shapes are checked
        first: a checkpoint of another model, or without the optimizer state this step needs, is refused."""
        plan, where = self._checkpoint_plan(step, "load"), checkpoint_path(path, "load")
        blocks = blocks_of(plan)
        check_fits(where, blocks, "load")
        tag = self._state.new_tag()
        reqs = {r: CheckpointRequest("load", str(where), blocks.get(r, []), tag) for r in range(self.n)}
        got = self._checkpoint_exchange(reqs, timeout, f"loading {str(where)!r} into {plan.name!r}")
        shards = {r: vals for r, (vals, _) in got.items() if r in plan.ranks}
        done = max(n for _, n in got.values())
        self._state.put(step, shards, tag, done)
        self._held = (self.driver, tag)
        return done

    def _ensure_workers(self) -> None:
        """Workers up and in step: after a failure, spawned ones are started again (their kept values are
        gone with them: the driver's copy is what continues)."""
        if self.driver is not None and not self.driver.healthy:
            self._kill()
            self.driver = None
        if self.driver is None:
            self._held = None
            if self.launch == "external":
                if self._procs or getattr(self, "_had_external", False):
                    raise ClusterError("the external workers were torn down after a failure; start them "
                                       "again and call wait_ready()")
                self._had_external = True
            self.wait_ready()

    def _checkpoint_plan(self, step: Any, what: str) -> ActorPlan:
        if self.closed:
            raise ClusterError("this LocalCluster is closed; create a new one")
        if isinstance(step, ActorPlan) or not isinstance(step, Runnable):
            raise InputTypeError(f"{what} needs a compiled step (sl.compile(...)): its state is what is "
                                 f"checkpointed; got {type(step).__name__}")
        need = ranks_needed(step)
        if need is not None and need > self.n:
            raise InputError(f"{what}: this step uses {need} ranks but the cluster has {self.n}")
        return step.plan(world_size=self.n)

    def _checkpoint_exchange(self, reqs: dict, timeout: float, what: str) -> dict:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InputError(f"{what}: timeout must be a number of seconds > 0, got {timeout!r}")
        self._ensure_workers()
        try:
            return exchange(self.driver, reqs, timeout, what)
        finally:
            if not self.driver.healthy:  # type: ignore[union-attr]
                self._held = None
                self._kill()

    def reset(self, step: Runnable | None = None) -> None:
        """Forget the parameters and optimizer state kept for ``step`` (None: for every step): its next
        run starts from its compiled weights, like ``run(step, ..., restart=True)``."""
        self._state.drop(step)

    def has_state(self, step: Runnable) -> bool:
        """Whether the next run of ``step`` here continues from kept state (a finished earlier run)."""
        return step in self._state

    def calibrate(self, steps: Any = None, **options: Any) -> Any:
        """Measure these workers once and return a calibrated ``sbplab.Hardware`` for the simulator:
        collectives per mesh axis (alpha-beta fits), the runtime's overhead per firing, the compute ops
        of ``steps`` (compiled steps or ActorPlans) and the machine's peaks, cached on disk per machine.

        It only runs ordinary plans, so it works the same for workers started with torchrun
        (``launch="external"``). ``options``: see ``sbplab.runtime.calibrate.calibrate``.
        """
        from .calibrate import calibrate

        return calibrate(self, steps, **options)

    def _kill(self) -> None:
        """Kill spawned workers and reap them; close connections to external ones."""
        if self.driver is not None:
            self.driver.close_connections()
        procs, self._procs = self._procs, []
        reap(procs)  # SIGKILL to each worker's process group, then reap (a Ctrl-C here does not stop it)

    def close(self) -> None:
        """Stop every worker, the accept thread and the port; no process is left behind, even when
        Ctrl-C interrupts the close. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.driver is not None and self.driver.healthy:
                self.driver.shutdown()
            procs, self._procs = self._procs, []
            reap(procs, grace_s=5.0)  # clean exits first (they leave their process groups), then SIGKILL
        finally:
            try:
                self._kill()
            finally:
                self.driver = None
                self._state.drop()  # the kept state of every step goes with the cluster
                self._held = None
                self._acceptor.close()
                while not self._incoming.empty():  # workers that joined but were never taken in
                    self._incoming.get_nowait()[0].close()
                if self._board is not None:
                    self._slots = []
                    self._board.close()
                    self._board = None
                self._remove_dir()

    @property
    def failed_authentications(self) -> int:
        """Connections to the driver that presented a wrong token (each is dropped, and its peer's next
        challenge comes later and later)."""
        return self._acceptor.failed_auth

    def _remove_dir(self) -> None:
        """The private directory and what is in it (the driver's socket, the store files)."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("ready" if self.alive else "down")
        return f"LocalCluster(n={self.n}, device_type={self.device_type!r}, {state}, address={self.address})"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listen_tcp(host: str, port: int, backlog: int) -> socket.socket:
    """The driver's TCP socket; an OS refusal (port in use, unknown host, no such address here) becomes
    a ClusterError naming host and port."""
    try:
        return listen_socket(host, port, backlog)
    except OSError as e:
        if isinstance(e, socket.gaierror) or (e.errno or 0) < 0:  # create_server re-raises getaddrinfo's EAI_*
            raise ClusterError(f"cannot listen on host {host!r}, port {port}: the host name does not resolve "
                               "here; give an IP address or a name of this machine") from None
        reasons = {errno.EADDRINUSE: "the port is in use (another program, or another cluster, listens there); "
                                     "port=0 picks a free one",
                   errno.EADDRNOTAVAIL: "this machine has no such address; give one of its own addresses "
                                        "(127.0.0.1, or 0.0.0.0 for all)",
                   errno.EACCES: "permission denied (ports below 1024 need root)"}
        raise ClusterError(f"cannot listen on host {host!r}, port {port}: "
                           f"{reasons.get(e.errno or 0, e.strerror or str(e))}") from None


def _interactive() -> bool:
    """A terminal or a running IPython kernel (checked without importing IPython)."""
    import sys

    ipython = sys.modules.get("IPython")
    if ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None:
        return True
    return sys.stderr.isatty()
