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
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge, wait

import torch

from .activity import ActivityBoard
from .comm import Comm
from .executor import ActorFailure, Executor, RunSpec
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


STORE_HOST = "127.0.0.1"  # every rank of a spawned cluster is on this machine


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
    """The rendezvous store of a spawned cluster: rank 0 opens it on a port the OS picks (no race for
    a "free" port with other programs) and tells the driver, which tells the others.

    torch's TCPStore server binds the wildcard address whatever ``host_name`` says (``host_name`` only
    tells clients where to connect), and the store has no authentication. So rank 0 binds a socket to
    loopback itself and hands it over as ``master_listen_fd``: the store is reachable from this machine
    only."""
    if init["init_method"] != "store":
        return None
    from datetime import timedelta

    from torch.distributed import TCPStore

    timeout = timedelta(seconds=init.get("dist_timeout", 1800))
    if init.get("store_port") is None:
        sock = socket.create_server((STORE_HOST, 0), backlog=max(64, init["world_size"]))
        port = sock.getsockname()[1]
        store = TCPStore(STORE_HOST, port, init["world_size"], True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=sock.detach())
        send(conn, ("store_port", store.port))
        return store
    return TCPStore(STORE_HOST, init["store_port"], init["world_size"], False, timeout=timeout)


def _exit_with_parent(parent_pid: int) -> None:
    """A spawned worker lives in its own session (so Jupyter's SIGINT misses it); if the driver's process
    vanishes without closing the connection cleanly (killed while this rank waits in a rendezvous), the
    worker must not outlive it."""
    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)
    threading.Thread(target=watch, name="sbplab-parent-watch", daemon=True).start()


def connect(address: tuple[str, int], token: bytes) -> Connection:
    """The authenticated connection to the driver. multiprocessing's ``Client`` opens an IPv4 socket for
    any (host, port), so an IPv6 driver address ("::1") gets its socket here and the same handshake."""
    if ":" not in address[0]:
        return Client(address, authkey=token)
    with socket.create_connection(address) as s:
        conn = Connection(s.detach())
    answer_challenge(conn, token)
    deliver_challenge(conn, token)
    return conn


def worker_main(address: tuple[str, int], token: bytes, rank: int | None = None, activity=None) -> None:
    """Entry point of a worker process (spawned: ``rank`` given; torchrun: read from the environment).

    activity: this rank's activity slots (``ActivityBoard.slot``), or None."""
    conn = connect(address, token)
    env_rank = rank if rank is not None else int(os.environ.get("RANK", "-1"))
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
        os._exit(1)
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sbplab.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--driver", required=True, help="HOST:PORT of the driver (LocalCluster.address)")
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
    host, _, port = args.driver.rpartition(":")
    if not host or not port.isdigit():
        ap.error(f"--driver must be HOST:PORT, got {args.driver!r}")
    token = worker_token(args.token_file)
    if args.parent_pid is not None:
        _exit_with_parent(args.parent_pid)
    activity = None
    if args.activity_fd is not None:
        if args.rank is None:
            ap.error("--activity-fd needs --rank")
        activity = ActivityBoard(args.activity_fd, args.rank + 1).slot(args.rank)
    worker_main((host.strip("[]"), int(port)), token.encode(), args.rank, activity)


if __name__ == "__main__":
    main()
