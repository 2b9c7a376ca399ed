"""LocalCluster: persistent worker processes, one per rank, driven from a notebook or a script.

    with sl.LocalCluster(4) as cluster:           # 4 Gloo ranks on this machine
        result = cluster.run(plan, batches, steps=3)

Workers connect back to the driver over a ``multiprocessing.connection`` socket (authenticated
with a token by HMAC; messages are pickles, so anyone holding the token can run code in the
driver and the workers: keep the token secret and listen on loopback unless the network is
trusted). The driver listens on 127.0.0.1 by default and refuses any other address without an
explicit token. Workers of other machines join with
``SBPLAB_TOKEN=... torchrun ... -m sbplab.worker --driver HOST:PORT`` (``launch="external"``).

A failed or interrupted run kills the workers (a half-finished collective would leave the process
groups out of step); spawned workers come back on the next run.

Workers are started with multiprocessing's spawn method, which re-imports a script's main module:
in a script, create clusters under ``if __name__ == "__main__":`` (notebooks need nothing).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Listener

from .driver import Driver, RunOptions, accept_forever
from .plan import ActorPlan
from .results import Batches, RunResult
from .worker import LOOPBACK_TOKEN, worker_main

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalCluster:
    """``n`` ranks of ``device_type`` ("cpu": Gloo; "cuda": NCCL with one GPU per rank).

    launch: "spawn" starts the workers here; "external" waits for ``n`` workers started elsewhere
        (torchrun) to connect to ``address``.
    host, port: where the driver listens (port 0: a free one).
    token: shared secret; required unless ``host`` is loopback.
    threads: torch intra-op threads per worker (default: cores divided among the workers).
    start_timeout: seconds to wait for all workers to join.
    """

    def __init__(self, n: int, device_type: str = "cpu", *, launch: str = "spawn", host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, threads: int | None = None,
                 start_timeout: float = 120.0) -> None:
        if n < 1:
            raise ValueError(f"a cluster needs at least one worker, got n={n}")
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
        if launch not in ("spawn", "external"):
            raise ValueError(f"launch must be 'spawn' or 'external', got {launch!r}")
        if host not in _LOOPBACK and not token:
            raise ValueError(f"listening on {host!r} (not loopback) needs a shared token=; workers pass the "
                             f"same one as $SBPLAB_TOKEN")
        if device_type == "cuda" and launch == "spawn":
            import torch

            have = torch.cuda.device_count()
            if have < n:
                raise ValueError(f"{n} cuda ranks need {n} GPUs (one per rank); this machine has {have}")
        self.n, self.device_type, self.launch = n, device_type, launch
        if token:
            self._token = token.encode()
        else:
            self._token = secrets.token_hex(16).encode() if launch == "spawn" else LOOPBACK_TOKEN
        self._threads = threads or max(1, (os.cpu_count() or 1) // n)
        self._start_timeout = start_timeout
        self._listener = Listener((host, port), authkey=self._token, backlog=max(n, 8))
        self.address: tuple[str, int] = self._listener.address  # type: ignore[assignment]
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=accept_forever, args=(self._listener, self._incoming), daemon=True,
                         name="sbplab-accept").start()
        self._procs: list = []
        self._activity: list = []
        self.driver: Driver | None = None
        self.closed = False
        if launch == "spawn":
            self._start()

    # --- life cycle --------------------------------------------------------------------------------
    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._activity = [ctx.RawArray("q", 4) for _ in range(self.n)]
        self._procs = [ctx.Process(target=worker_main, args=(self.address, self._token, r, self._activity[r]),
                                   name=f"sbplab-rank{r}", daemon=True) for r in range(self.n)]
        for p in self._procs:
            p.start()
        init = "store"  # rank 0 opens a TCPStore on a port of the OS's choosing
        self.driver = Driver(self._listener, self._incoming, self.n, self.device_type, init, self._threads,
                             self._procs, self._activity)
        try:
            self.driver.connect(self._start_timeout)
        except BaseException:
            self._kill()
            raise

    def wait_ready(self, timeout: float | None = None) -> None:
        """External launch: block until all ``n`` workers have joined."""
        if self.driver is None:
            if self.launch == "spawn":
                self._start()
                return
            self.driver = Driver(self._listener, self._incoming, self.n, self.device_type, "env://",
                                 self._threads, [], [])
            try:
                self.driver.connect(timeout or self._start_timeout)
            except BaseException:
                self.driver = None
                raise

    @property
    def alive(self) -> bool:
        """True while workers are up and in step (a failed run takes them down)."""
        return self.driver is not None and self.driver.healthy

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def run(self, plan: ActorPlan, batches: Batches | None = None, steps: int = 1, *, timeout: float = 10.0,
            progress: bool | None = None, params: bool = True, trace: bool = True,
            on_step: Callable[[int, int, float | None], None] | None = None) -> RunResult:
        """Run ``steps`` training steps of ``plan`` and return losses, final parameters and a trace.

        plan: an ActorPlan, or a compiled training step (``sl.compile(...)``), lowered here.
        batches: one mapping feed -> global tensor per step (or one for every step, or a function of
            the step); sources cut their shards from it.
        timeout: seconds without any rank finishing a firing before the run counts as hung.
        progress: a bar over steps (default: on when stderr is a terminal or in a notebook).
        on_step: ``on_step(step, steps, loss)`` is called here, in the driver, as each step finishes on
            every rank: once per step, in order, ``loss`` being that step's global loss (the value
            ``result.losses[step]`` will have), or None if the plan has no "loss" sink. The workers
            then send one small message per step. An exception raised by ``on_step`` ends ``run``
            with it (workers still busy with later steps are torn down, like after Ctrl-C).
        """
        if self.closed:
            raise RuntimeError("this LocalCluster is closed; create a new one")
        if not isinstance(plan, ActorPlan):
            if not (hasattr(plan, "physical") and hasattr(plan, "graph")):
                raise TypeError(f"run needs an ActorPlan or a compiled step, got {type(plan).__name__}")
            from .lower import lower_to_actors

            plan = lower_to_actors(plan.physical, plan.graph, world_size=self.n,
                                   name=getattr(plan.strategy, "name", "compiled"))
        if self.driver is not None and not self.driver.healthy:
            self._kill()
            self.driver = None
        if self.driver is None:
            if self.launch == "external":
                if self._procs or getattr(self, "_had_external", False):
                    raise RuntimeError("the external workers were torn down after a failure; start them "
                                       "again and call wait_ready()")
                self._had_external = True
            self.wait_ready()
        if plan.world_size > self.n:
            raise ValueError(f"plan {plan.name!r} has {plan.world_size} ranks but this cluster has {self.n}")
        if plan.world_size < self.n:  # the extra workers idle (they still join new process groups)
            plan = ActorPlan(self.n, dict(plan.ranks), plan.device_type, plan.micro_batches, plan.comm_order,
                             plan.name, plan.imports)
        if plan.device_type != self.device_type:
            raise ValueError(f"plan {plan.name!r} is for {plan.device_type} but this cluster runs "
                             f"{self.device_type}")
        if progress is None:
            progress = _interactive()
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be a function (step, steps, loss), got {type(on_step).__name__}")
        opts = RunOptions(steps=steps, timeout=timeout, progress=progress, params=params, trace=trace,
                          on_step=on_step)
        try:
            return self.driver.run(plan, batches, opts)  # type: ignore[union-attr]
        except BaseException:
            if not self.driver.healthy:  # type: ignore[union-attr]
                self._kill()
            raise

    def _kill(self) -> None:
        """Kill spawned workers and reap them; close connections to external ones."""
        if self.driver is not None:
            self.driver.close_connections()
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=10)
        self._procs = []

    def close(self) -> None:
        """Stop every worker; no process is left behind. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if self.driver is not None and self.driver.healthy:
            self.driver.shutdown()
        deadline = time.monotonic() + 5
        for p in self._procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        self._kill()
        self.driver = None
        self._listener.close()

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


def _interactive() -> bool:
    """A terminal or a running IPython kernel (checked without importing IPython)."""
    import sys

    ipython = sys.modules.get("IPython")
    if ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None:
        return True
    return sys.stderr.isatty()
