"""Helpers for the fault tests: a tiny data-parallel step with its single-device reference, and which
TCP ports a process listens on (psutil when installed, else /proc/net/tcp{,6})."""

from __future__ import annotations

import os
import time

import pytest
import torch

from sbplab.runtime.examples import data_parallel_linear, reference_mlp_steps


def check_dp_run(cluster, steps: int = 2) -> None:
    """A 2-step data-parallel linear regression on ``cluster`` matches plain PyTorch."""
    torch.manual_seed(0)
    w0 = torch.randn(5, 2)
    batches = [{"x": torch.randn(8, 5), "t": torch.randn(8, 2)} for _ in range(steps)]
    res = cluster.run(data_parallel_linear(cluster.n, w0, lr=0.1, batch=8), batches, steps=steps,
                      progress=False, timeout=30.0)
    ref_losses, ref_w = reference_mlp_steps([w0], batches, 0.1, steps)
    assert res.losses == pytest.approx(ref_losses, rel=1e-5)
    assert torch.allclose(res.params["w"].full(), ref_w[0], atol=1e-6)


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
