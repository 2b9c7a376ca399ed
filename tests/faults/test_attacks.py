"""Attacks from another local process: without the token it reaches neither the rendezvous store nor the
driver, a flood of connections during a worker restart does not stop it, a mistyped token is named, and
a worker that Gloo aborts (a flood on its pair listener) ends the run with Gloo's own words."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time

import pytest
from fault_helpers import check_dp_run, listening, wait_until

from sbplab.runtime import LocalCluster, RunError
from sbplab.runtime.examples import data_parallel_linear

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]



@pytest.fixture(scope="module")
def cluster():
    """One spawned cluster for the attacks (each leaves it usable, as the next check shows)."""
    with LocalCluster(2) as c:
        yield c

# what another user tries on the cluster's private directory; prints one word per attempt
_STRANGER = r"""
import os, socket, sys
folder, store, sock = sys.argv[1:4]
os.setgid(65534); os.setuid(65534)
def attempt(what, fn):
    try:
        fn(); print(what, "ok")
    except PermissionError:
        print(what, "denied")
attempt("list", lambda: os.listdir(folder))
attempt("read", lambda: open(store, "rb").read())
attempt("write", lambda: open(store, "ab").write(b"x"))
attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect(sock))
"""


def test_another_user_cannot_read_or_write_rendezvous_keys_nor_reach_the_driver(cluster):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user (nobody); the 0700 mode is checked in test_listen_and_close")
    c = cluster
    check_dp_run(c)
    folder = os.path.dirname(c.address)
    store = os.path.join(folder, next(f for f in os.listdir(folder) if f.startswith("store-")))
    out = subprocess.run([sys.executable, "-c", _STRANGER, folder, store, c.address], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["list", "denied", "read", "denied", "write", "denied", "connect", "denied"], \
        out.stdout + out.stderr
    check_dp_run(c)  # and the cluster never noticed


# a flood from a process of its own: ``rate`` connections a second, each closed at once or held silent
_FLOOD = r"""
import signal, socket, sys, time
path, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
held, n, t0, stop = [], 0, time.monotonic(), []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while time.monotonic() - t0 < seconds and not stop:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except OSError:
        s.close()
    else:
        n += 1
        if n % 2:
            held.append(s)  # silent: holds a handshake until the driver's deadline
            if len(held) > 200:
                held.pop(0).close()
        else:
            s.close()
    time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
print(n / (time.monotonic() - t0), flush=True)
"""


def test_a_flood_of_300_connections_a_second_during_a_worker_restart_does_not_stop_it(cluster):
    c = cluster
    check_dp_run(c)
    old = c.pids
    flood = subprocess.Popen([sys.executable, "-c", _FLOOD, c.address, "300", "150"], stdout=subprocess.PIPE,
                             text=True)
    try:
        wait_until(lambda: c._acceptor.rejected > 20, 30, "the flood reaching the driver")
        c._kill()  # as after a failed run: the next run starts fresh workers, through the flood
        check_dp_run(c)
        assert set(c.pids).isdisjoint(old) and flood.poll() is None  # restarted while the flood went on
    finally:
        flood.terminate()
        rate = float(flood.communicate(timeout=60)[0])
    assert rate > 250, f"the flood ran at {rate:.0f} connections a second only"
    assert c.failed_authentications == 0  # strangers that never answer a challenge are no failed guess
    check_dp_run(c)


def test_a_worker_with_a_mistyped_token_is_named(tmp_path):
    with LocalCluster(1, launch="external") as c:
        host, port = c.address
        env = {k: v for k, v in os.environ.items() if k != "SBPLAB_TOKEN"}
        env.update(SBPLAB_TOKEN=c.token[:-1] + ("0" if c.token[-1] != "0" else "1"), RANK="0", WORLD_SIZE="1")
        out = subprocess.run([sys.executable, "-m", "sbplab.worker", "--driver", f"{host}:{port}"], env=env,
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode != 0 and "rank 0" in out.stderr and "refused this worker's token" in out.stderr
        with pytest.raises(RunError) as e:
            c.wait_ready(timeout=1.0)
        assert "worker rank 0 presented a wrong token" in str(e.value)
        assert "1 connection failed to authenticate" in str(e.value)
        assert c.failed_authentications == 1


def test_a_gloo_abort_puts_its_cause_in_the_error(cluster):
    """Gloo keeps every connection its pair listener accepts and aborts the worker (SIGABRT, the cause on
    stderr only) when it runs out of descriptors. With a low descriptor limit a short flood does it."""
    import socket

    import torch

    c = cluster
    check_dp_run(c)
    victim = c.pids[1]
    (port,) = {p for _, p in listening(victim)}  # its Gloo pair listener
    resource.prlimit(victim, resource.RLIMIT_NOFILE, (64, resource.prlimit(victim, resource.RLIMIT_NOFILE)[1]))
    g = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(8, 5, generator=g), "t": torch.randn(8, 2, generator=g)}
    stop, going = threading.Event(), threading.Event()

    def flood() -> None:
        going.wait(60)  # the run is under way
        while not stop.is_set():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                time.sleep(0.01)

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        with pytest.raises(RunError) as e:
            c.run(data_parallel_linear(2, torch.zeros(5, 2), lr=0.1, batch=8), batch, steps=20000,
                  progress=False, timeout=30.0,
                  on_step=lambda step, steps, loss: step == 5 and going.set())
    finally:
        stop.set()
        t.join()
    msg = str(e.value)
    assert "worker rank 1" in msg and "SIGABRT" in msg, msg
    assert "its last words on stderr" in msg and "Too many open files" in msg, msg
    check_dp_run(c)  # fresh workers
