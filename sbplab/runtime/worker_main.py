"""A worker process: one rank. Joins the driver, then runs whatever plans the driver sends.

The main thread owns the connection to the driver: it answers clock pings and status requests
and sends a heartbeat while a run is going, so the driver can tell a hang from slow work even
when the run thread is stuck inside a kernel or a collective. Runs happen on a second thread,
which also tells the driver as each step finishes when asked to (one small message per step,
sent under the same lock as everything else on the connection).

Started by ``LocalCluster`` (a fresh ``python -m sbplab.worker`` per rank) or by hand on other machines:

    SBPLAB_TOKEN=... torchrun --nnodes=2 --node-rank=0 ... -m sbplab.worker --driver HOST:PORT
    torchrun ... -m sbplab.worker --driver HOST:PORT --token-file ~/.sbplab-token   # a chmod 600 file

There is no default token: a worker without one refuses to start (see ``tokens``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
import traceback
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait

import torch

from .activity import ActivityBoard
from .comm import Comm
from .executor import ActorFailure, Executor, RunSpec
from .handshake import WrongTokenError, worker_side
from .tokens import worker_token
from .wire import recv, send

HEARTBEAT_S = 0.25


class Worker:
    def __init__(self, conn: Connection, rank: int, world_size: int, device_type: str, device: torch.device,
                 activity=None) -> None:
        self.conn, self.rank, self.world_size = conn, rank, world_size
        self.device_type, self.device = device_type, device
        self.comm = Comm(rank, world_size, device_type, device)
        self.activity = activity
        self.executor: Executor | None = None
        # (tag, State name -> final value) of the last run, if it asked to keep them: the next run of the
        # same compiled step starts from them instead of having the driver ship them back (``carry.py``)
        self.kept: tuple[int, dict[str, torch.Tensor]] | None = None
        self.send_lock = threading.Lock()  # the run thread reports steps on the same connection

    def _send(self, msg: tuple) -> None:
        with self.send_lock:
            send(self.conn, msg)

    def serve(self) -> None:
        while True:
            msg = recv(self.conn)
            if msg[0] == "clock":
                send(self.conn, ("clock", time.perf_counter_ns()))
            elif msg[0] == "status":
                send(self.conn, ("status", self.rank, [{"what": "idle", "actor": None, "op": None,
                                                        "text": "idle (not in a run)"}]))
            elif msg[0] == "run":
                if self._run(msg[1]):
                    return
            elif msg[0] == "checkpoint":  # cluster.save / cluster.load: this rank's blocks, with DCP
                from .checkpoint_worker import serve_checkpoint

                send(self.conn, serve_checkpoint(self, msg[1]))
            elif msg[0] == "close":
                return

    def _run(self, spec: RunSpec) -> bool:
        """Runs one plan; returns True if the driver asked to close meanwhile."""
        box: dict = {}
        done_r, done_w = Pipe(duplex=False)
        t = threading.Thread(target=self._run_thread, args=(spec, box, done_w), name="sbplab-run",
                             daemon=True)
        t.start()
        closing = False
        while t.is_alive():
            if done_r in wait([self.conn, done_r], timeout=HEARTBEAT_S):
                t.join()
                break
            while self.conn.poll():
                msg = recv(self.conn)
                if msg[0] == "status":
                    self._send(("status", self.rank, self._status()))
                elif msg[0] == "clock":
                    self._send(("clock", time.perf_counter_ns()))
                elif msg[0] == "close":
                    closing = True
                    if self.executor is not None:
                        self.executor.stopped = True
            if closing:
                return True
            ex = self.executor
            steps = ex.steps_done() if ex is not None else 0
            age = ex.progress_age_s() if ex is not None else 0.0
            self._send(("beat", spec.run_id, self.rank, steps, age))
        if "error" in box:
            self._send(("error", spec.run_id, box["error"]))
        else:
            kept = box["result"].pop("kept", None)
            if kept is not None:
                self.kept = (spec.keep, kept)  # type: ignore[assignment]
            self._send(("done", spec.run_id, self.rank, box["result"]))
        self.executor = None
        return False

    def _run_thread(self, spec: RunSpec, box: dict, done: Connection) -> None:
        try:
            # OpenMP keeps its thread count per thread: the count set at start-up holds for the main thread
            # only, and a kernel of this one (oneDNN's convolutions) would otherwise start a team as large
            # as the machine, whose spinning members take the cores the other ranks compute on.
            torch.set_num_threads(torch.get_num_threads())
            self._run_body(spec, box)
        finally:
            done.send(True)

    def _run_body(self, spec: RunSpec, box: dict) -> None:
        try:
            self.comm.ensure_groups(spec.groups, spec.pairs)
            report = None
            if spec.report_steps:
                def report(step: int, losses: dict) -> None:
                    self._send(("step", spec.run_id, self.rank, step, losses))
            kept, self.kept = self.kept, None  # a run starts from the kept state or lets it go
            resume = None
            if spec.resume is not None:
                if kept is None or kept[0] != spec.resume:
                    raise RuntimeError(f"rank {self.rank}: the driver asked to continue from kept state "
                                       f"{spec.resume}, but this worker keeps {kept[0] if kept else 'none'}")
                resume = kept[1]
            del kept
            self.executor = Executor(spec, self.rank, self.comm, self.device, self.activity, report, resume)
            box["result"] = _profiled(self.executor.run, self.rank, spec.run_id)
        except ActorFailure as e:
            box["error"] = e.info
        except BaseException:  # noqa: BLE001 - everything goes back to the driver
            box["error"] = {"rank": self.rank, "actor": None, "op": None, "firing": None,
                            "traceback": traceback.format_exc()}

    def _status(self) -> list[dict]:
        ex = self.executor
        if ex is None:
            return [{"what": "setup", "actor": None, "op": None,
                     "text": "setting up (process groups, actors)"}]
        lines = ex.status()
        frame = sys._current_frames().get(ex.thread_id)
        if frame is not None and ex.compute_inflight is not None:
            lines[0]["stack"] = "".join(traceback.format_stack(frame)[-8:])
        return lines


def _profiled(run, rank: int, run_id: int):
    """``run()``, under cProfile when ``SBPLAB_PROFILE_DIR`` names a folder: the stats of each run go to
    ``rank{rank}-run{run_id}.prof`` there, to find where a rank's time goes (``python -m pstats``)."""
    folder = os.environ.get("SBPLAB_PROFILE_DIR")
    if not folder:
        return run()
    import cProfile  # noqa: PLC0415 - only when asked

    prof = cProfile.Profile()
    try:
        return prof.runcall(run)
    finally:
        prof.dump_stats(os.path.join(folder, f"rank{rank}-run{run_id}.prof"))


def _store(conn: Connection, init: dict):
    """The rendezvous store of a spawned cluster: a ``FileStore`` in the cluster's private directory
    (mode 0700, made by the driver), a file of its own per start.

    Not a TCPStore: torch's TCPStore cannot authenticate, so any local process could read and overwrite
    its keys (and so break or steer the process groups). A file in a directory only this user can enter
    is out of reach of other local users; the driver deletes the directory when the cluster closes."""
    if init["init_method"] != "file":
        return None
    from torch.distributed import FileStore

    return FileStore(init["store_path"], init["world_size"])


def _more_descriptors() -> None:
    """Raise the soft limit on open files to the hard one (at most 65536). Gloo's pair listener keeps each
    connection it accepts, and aborts the process when it runs out of descriptors: the higher limit makes
    a flood of connections from a local stranger take much longer to do that (README, "Trust")."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


_PARENT: dict[str, object] = {}  # the spawning driver's pid and private directory, for the exits below


def _exit_with_parent(parent_pid: int, private_dir: str | None) -> None:
    """A spawned worker lives in its own session (so Jupyter's SIGINT misses it); if the driver's process
    vanishes without closing the connection cleanly (killed while this rank waits in a rendezvous), the
    worker must not outlive it, nor leave the driver's private directory (socket, store) on disk."""
    _PARENT.update(pid=parent_pid, dir=private_dir)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                _orphan_exit()
    threading.Thread(target=watch, name="sbplab-parent-watch", daemon=True).start()


def _orphan_exit() -> None:
    """Exit at once; if the driver that spawned this worker is gone (SIGKILLed: none of its clean-up ran),
    delete its private directory first (any of its workers may; the first one does)."""
    folder = _PARENT.get("dir")
    deadline = time.monotonic() + 1.0  # a dying driver's sockets close before its children are reparented
    while folder and os.getppid() == _PARENT.get("pid") and time.monotonic() < deadline:
        time.sleep(0.02)
    if folder and os.getppid() != _PARENT.get("pid"):
        import shutil

        try:
            if os.path.basename(str(folder)).startswith("sbplab-") and os.stat(str(folder)).st_uid == os.getuid():
                shutil.rmtree(str(folder), ignore_errors=True)
        except OSError:
            pass
    os._exit(1)


JOIN_TIMEOUT_S = 120.0  # how long a worker keeps trying to join a driver that is not there yet or busy


class WrongToken(SystemExit):
    """This worker's token is not the driver's: trying again cannot help."""


def _open(address: tuple[str, int] | str) -> Connection:
    if isinstance(address, str):  # a spawned cluster's Unix socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(10)  # a full backlog (a flood) blocks a Unix connect: give up and try again
            s.connect(address)
            s.settimeout(None)
        except BaseException:
            s.close()
            raise
        return Connection(s.detach())
    with socket.create_connection(address, timeout=10) as s:
        s.settimeout(None)
        return Connection(s.detach())


def connect(address: tuple[str, int] | str, token: bytes, rank: int = -1,
            timeout: float = JOIN_TIMEOUT_S) -> Connection:
    """The authenticated connection to the driver (``handshake``), a TCP (host, port) or a Unix socket
    path. A driver that is not listening yet, or that dropped this connection before a verdict (its
    handshake slots were busy), is tried again with a growing pause until ``timeout``; a wrong token
    ends the worker at once with a message naming its rank."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    where = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
    while True:
        try:
            conn = _open(address)
        except socket.gaierror as e:
            raise SystemExit(f"sbplab.worker: cannot resolve the driver's host {address[0]!r} "
                             f"(--driver {where}): {e.strerror}") from None
        except OSError as e:
            conn, err = None, e
        if conn is not None:
            try:
                worker_side(conn, token, rank)
                return conn
            except WrongTokenError as e:
                conn.close()
                raise WrongToken(f"sbplab.worker: rank {rank}: {e} (driver {where}); check $SBPLAB_TOKEN or "
                                 f"--token-file: it must be the cluster's token (LocalCluster(...).token)") from None
            except (EOFError, OSError) as e:
                conn.close()
                err = e
        if time.monotonic() + pause > deadline:
            raise SystemExit(f"sbplab.worker: rank {rank}: could not join the driver at {where} within "
                             f"{timeout:.0f} s: {err!r}")
        time.sleep(pause)
        pause = min(1.0, pause * 2)


def worker_main(address: tuple[str, int] | str, token: bytes, rank: int | None = None, activity=None) -> None:
    """Entry point of a worker process (spawned: ``rank`` given; torchrun: read from the environment).

    activity: this rank's activity slots (``ActivityBoard.slot``), or None."""
    env_rank = rank if rank is not None else int(os.environ.get("RANK", "-1"))
    conn = connect(address, token, env_rank)
    send(conn, ("hello", {"rank": env_rank, "pid": os.getpid(), "host": socket.gethostname(),
                         "world_size": int(os.environ.get("WORLD_SIZE", "0")),
                         "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}))
    msg = recv(conn)
    if msg[0] != "init":
        return
    init = msg[1]
    device_type = init["device_type"]
    if device_type == "cuda":
        torch.cuda.set_device(init.get("local_rank", 0))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if init.get("threads"):
        torch.set_num_threads(init["threads"])
    try:
        store = _store(conn, init)
        Comm.init(init["rank"], init["world_size"], device_type, init["init_method"],
                  init.get("dist_timeout", 1800), store)
    except BaseException:  # noqa: BLE001
        send(conn, ("init_error", init["rank"], traceback.format_exc()))
        return
    send(conn, ("ready", init["rank"]))
    w = Worker(conn, init["rank"], init["world_size"], device_type, device, activity)
    try:
        w.serve()
    except (EOFError, ConnectionError, OSError, KeyboardInterrupt):
        # the driver went away (maybe mid-collective), or someone interrupted this worker: leave at once
        # rather than hang in teardown; the driver notices and starts a fresh worker on the next run
        _orphan_exit()
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sbplab.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--driver", required=True,
                    help="HOST:PORT of the driver (LocalCluster.address), or the path of its Unix socket")
    ap.add_argument("--token-file", default=None, metavar="PATH",
                    help="file holding the cluster's token, readable by you only (default: $SBPLAB_TOKEN)")
    ap.add_argument("--token", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=None, help="set by LocalCluster (torchrun: $RANK)")
    ap.add_argument("--activity-fd", type=int, default=None, metavar="FD",
                    help="set by LocalCluster: the activity slots file, inherited")
    ap.add_argument("--parent-pid", type=int, default=None, help="set by LocalCluster: exit when it exits")
    args = ap.parse_args(argv)
    if args.token is not None:
        ap.error("--token is not accepted: a command line shows in `ps` to every user of the machine; "
                 "set $SBPLAB_TOKEN or pass --token-file PATH")
    address: tuple[str, int] | str = args.driver
    if not args.driver.startswith("/"):
        host, _, port = args.driver.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            ap.error(f"--driver must be HOST:PORT (a port in 1..65535) or a socket path, got {args.driver!r}")
        address = (host.strip("[]"), int(port))
    token = worker_token(args.token_file)
    _more_descriptors()
    if args.parent_pid is not None:
        _exit_with_parent(args.parent_pid, os.path.dirname(address) if isinstance(address, str) else None)
    activity = None
    if args.activity_fd is not None:
        if args.rank is None:
            ap.error("--activity-fd needs --rank")
        activity = ActivityBoard(args.activity_fd, args.rank + 1).slot(args.rank)
    worker_main(address, token.encode(), args.rank, activity)


if __name__ == "__main__":
    main()
