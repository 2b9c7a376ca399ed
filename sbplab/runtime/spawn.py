"""Spawned workers: fresh ``python -m sbplab.worker`` processes, each in its own process group.

Why not multiprocessing: its spawn method re-imports the driver's main module, so a script piped on
stdin or run with ``python -c`` cannot start workers at all. A fresh interpreter that imports only sbplab
works under any driver (notebook, script, stdin, ``-c``). Its own session keeps a Jupyter interrupt
(SIGINT to the kernel's process group) away from the workers. The token travels in the environment
(readable by this user only), never in argv, which every user can read in ``ps``.

Each worker's stderr comes through a pipe that a thread of the driver copies to the driver's own
stderr as it arrives (where it went before) and keeps the last lines of: a worker that dies without a
word on its connection (a C++ abort inside Gloo, a segfault) often said why on stderr only, and the
``RunError`` quotes it.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from .tokens import TOKEN_ENV

# a driver itself started by torchrun must not hand its own rank and world size to the workers it spawns
_LAUNCHER_VARS = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"})


class WorkerProcess:
    """One worker process, with the ``multiprocessing.Process`` interface the driver uses
    (``pid``, ``is_alive``, ``exitcode``, ``sentinel``, ``join``, ``kill``)."""

    def __init__(self, popen: subprocess.Popen, rank: int) -> None:
        self.popen, self.rank, self.pid = popen, rank, popen.pid
        self._tail: collections.deque[bytes] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._tee: threading.Thread | None = None
        if popen.stderr is not None:
            self._tee = threading.Thread(target=self._copy_stderr, name=f"sbplab-stderr-{rank}", daemon=True)
            self._tee.start()
        self._pidfd: int | None = None
        if hasattr(os, "pidfd_open"):  # readable once the process ends; lets the driver wait on it
            try:
                self._pidfd = os.pidfd_open(popen.pid)
            except OSError:
                self._pidfd = None

    def _copy_stderr(self) -> None:
        """Copy the worker's stderr to ours line by line, keeping the last lines; ends at its end of file."""
        stream = self.popen.stderr
        try:
            for line in iter(stream.readline, b""):  # type: ignore[union-attr]
                self._tail.append(line[-STDERR_LINE_BYTES:])
                try:
                    os.write(2, line)
                except OSError:
                    pass
        except (OSError, ValueError):
            pass
        finally:
            stream.close()  # type: ignore[union-attr]

    def stderr_tail(self, wait_s: float = 1.0) -> str:
        """The last lines the worker wrote to stderr (after waiting up to ``wait_s`` for the rest of a
        dead worker's output), as text."""
        if self._tee is not None and self.popen.poll() is not None:
            self._tee.join(wait_s)
        return b"".join(self._tail).decode("utf-8", "replace")

    @property
    def sentinel(self) -> int | None:
        return self._pidfd

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        """SIGKILL to the worker's whole process group (anything its kernels started goes too)."""
        if self.popen.poll() is not None:
            return  # reaped: its pid may belong to someone else by now
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.popen.kill()

    def release(self) -> None:
        if self._tee is not None:
            self._tee.join(5)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __repr__(self) -> str:
        return f"WorkerProcess(rank={self.rank}, pid={self.pid}, exitcode={self.exitcode})"


STDERR_TAIL_LINES = 40  # lines of a worker's stderr kept for the error if it dies
STDERR_LINE_BYTES = 2000


def spawn_worker(address: tuple[str, int] | str, token: str, rank: int, activity_fd: int) -> WorkerProcess:
    """Start rank ``rank``; it connects back to ``address`` (a Unix socket path, or TCP host and port) and
    proves it holds ``token``."""
    where = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
    cmd = [sys.executable, "-m", "sbplab.worker", "--driver", where, "--rank", str(rank),
           "--activity-fd", str(activity_fd), "--parent-pid", str(os.getpid())]
    popen = subprocess.Popen(cmd, env=worker_env(token), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True, close_fds=True, pass_fds=(activity_fd,))
    return WorkerProcess(popen, rank)


def worker_env(token: str) -> dict[str, str]:
    """The driver's environment plus the token, its import path, and loopback-only sockets for
    Gloo/NCCL (unless the user chose interfaces): all ranks of a spawned cluster live on this machine."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env[TOKEN_ENV] = token
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    own = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})  # the interpreter's own paths come anyway
    # the driver's extra import paths (script folder, added dirs), so plans' kernel modules import there too
    paths = [p for p in [here, *sys.path] if p and os.path.isdir(p) and not p.startswith(own)]
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    lo = loopback_interface()
    if lo is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    return env


def loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), or None if none is found."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for want in ("lo", "lo0"):
        if want in names:
            return want
    return None


def reap(procs: list[WorkerProcess], grace_s: float = 0.0) -> None:
    """Wait up to ``grace_s`` for clean exits, then SIGKILL the rest and reap all of them.

    A Ctrl-C while waiting does not stop the teardown: every process is killed and reaped first,
    then the KeyboardInterrupt goes on."""
    interrupted: BaseException | None = None
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.join(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt as e:
            interrupted = e
            break
    for p in procs:
        p.kill()
    for p in procs:
        while True:
            try:
                p.join(10)
                break
            except KeyboardInterrupt as e:  # keep reaping; a zombie per Ctrl-C is what we avoid
                interrupted = e
        p.release()
    if interrupted is not None:
        raise interrupted
