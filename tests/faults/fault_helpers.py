"""Helpers for the fault tests: a tiny data-parallel step with its single-device reference, which TCP
ports a process listens on (psutil when installed, else /proc/net/tcp{,6}), and a snapshot of this
process's threads, sockets, descriptors and children to prove a closed cluster left none behind."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

import pytest
import torch

from sbplab.runtime.examples import data_parallel_linear, reference_mlp_steps


def check_dp_run(cluster, steps: int = 2, seed: int = 0) -> list[float]:
    """A 2-step data-parallel linear regression on ``cluster`` matches plain PyTorch (data from ``seed``)."""
    g = torch.Generator().manual_seed(seed)  # not the global one: clusters may be checked from threads
    w0 = torch.randn(5, 2, generator=g)
    batches = [{"x": torch.randn(8, 5, generator=g), "t": torch.randn(8, 2, generator=g)} for _ in range(steps)]
    res = cluster.run(data_parallel_linear(cluster.n, w0, lr=0.1, batch=8), batches, steps=steps,
                      progress=False, timeout=30.0)
    ref_losses, ref_w = reference_mlp_steps([w0], batches, 0.1, steps)
    assert res.losses == pytest.approx(ref_losses, rel=1e-5)
    assert torch.allclose(res.params["w"].full(), ref_w[0], atol=1e-6)
    return res.losses


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """The process no longer exists (a zombie still counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def listening(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of every TCP socket process ``pid`` listens on."""
    try:
        import psutil
    except ImportError:
        return _listening_proc(pid)
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("inet")
            if c.status == psutil.CONN_LISTEN}


def _listening_proc(pid: int) -> set[tuple[str, int]]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                hexip, hexport = cols[1].split(":")
                out.add((_ip(hexip, v6), int(hexport, 16)))
    return out


def _ip(hexip: str, v6: bool) -> str:
    import ipaddress

    raw = bytes.fromhex(hexip)
    # /proc prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw))


def exited(pid: int) -> bool:
    """The process has ended: gone, or a zombie waiting for a parent that is not us (an orphan whose
    driver was killed is reparented; reaping it is then init's business)."""
    if gone(pid):
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def children(pid: int | None = None) -> set[int]:
    """Pids of the processes whose parent is ``pid`` (default: this process), zombies included."""
    pid = os.getpid() if pid is None else pid
    try:
        import psutil
    except ImportError:
        out = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError):
                    continue
                if ppid == pid:
                    out.add(int(entry))
        return out
    try:
        return {c.pid for c in psutil.Process(pid).children()}
    except psutil.NoSuchProcess:
        return set()


def fds(pid: int | None = None) -> list[str]:
    """What each open descriptor of ``pid`` (default: this process) points at."""
    base = f"/proc/{os.getpid() if pid is None else pid}/fd"
    out = []
    for fd in os.listdir(base):
        try:
            out.append(os.readlink(f"{base}/{fd}"))
        except OSError:
            continue  # closed meanwhile (the descriptor listdir itself used)
    return out


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def refused(address: tuple[str, int] | str) -> bool:
    """Nothing listens at ``address`` any more (a TCP (host, port), or a Unix socket path, gone with its
    private directory)."""
    try:
        connect_raw(address).close()
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    return False


def connect_raw(address: tuple[str, int] | str) -> socket.socket:
    """A plain socket to the driver, TCP or Unix, as any local process could open one."""
    if isinstance(address, str):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect(address)
        except BaseException:
            s.close()
            raise
        return s
    return socket.create_connection(address, timeout=10)


def join_with(address: tuple[str, int] | str, token: bytes, rank: int = -1):
    """Run the worker's side of the join handshake with ``token``; returns the open Connection, or raises
    WrongTokenError (refused) or EOFError/OSError (dropped before a verdict)."""
    from multiprocessing.connection import Connection

    from sbplab.runtime.handshake import worker_side

    sock = connect_raw(address)
    sock.setblocking(True)
    conn = Connection(sock.detach())
    try:
        worker_side(conn, token, rank)
    except BaseException:
        conn.close()
        raise
    return conn


@dataclass
class Snapshot:
    """What this process holds before a cluster starts; ``assert_clean`` compares after close."""

    threads: set[threading.Thread]
    sockets: int
    fds: int
    children: set[int]
    listening: set[tuple[str, int]]

    @classmethod
    def take(cls) -> Snapshot:
        mine = fds()
        return cls(set(threading.enumerate()), sum(t.startswith("socket:") for t in mine), len(mine),
                   children(), listening(os.getpid()))

    def assert_clean(self, address: tuple[str, int] | None = None, worker_pids: list[int] = ()) -> None:
        """No worker left (not even a zombie), no new thread, socket, descriptor or listening port."""
        assert all(gone(p) for p in worker_pids), [p for p in worker_pids if not gone(p)]
        wait_until(lambda: children() <= self.children, 10, "reaping every worker")
        wait_until(lambda: set(threading.enumerate()) <= self.threads, 10, "the cluster's threads ending")
        if address is not None:
            assert refused(address)
        now = Snapshot.take()
        assert now.listening == self.listening
        assert now.sockets == self.sockets, "a socket of the cluster is still open"
        assert now.fds == self.fds, "a descriptor of the cluster is still open"
