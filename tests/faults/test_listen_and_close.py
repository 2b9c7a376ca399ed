"""Sockets: a spawned cluster's driver listens on a Unix socket in a private 0700 directory and its
workers meet in a FileStore there, so only Gloo listens on TCP, on loopback only; ``close()`` leaves no
process, thread, port or file behind, even when Ctrl-C interrupts it."""

from __future__ import annotations

import _thread
import os
import signal
import stat
import threading

import pytest
from fault_helpers import check_dp_run, connect_raw, gone, listening

from sbplab.runtime import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(120)]


def _accept_threads() -> int:
    return sum(t.name == "sbplab-accept" and t.is_alive() for t in threading.enumerate())


def _refused(address) -> bool:
    try:
        connect_raw(address).close()
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    return False


def test_driver_and_store_are_private_files_and_gloo_listens_on_loopback_only():
    before = listening(os.getpid())
    with LocalCluster(2) as c:
        check_dp_run(c)
        folder = os.path.dirname(c.address)
        assert os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(folder).st_uid == os.getuid()
        assert stat.S_ISSOCK(os.stat(c.address).st_mode)
        assert listening(os.getpid()) == before  # the driver opened no TCP port
        assert any(f.startswith("store-") for f in os.listdir(folder))  # the FileStore of this start
        workers = [listening(pid) for pid in c.pids]
        assert all(workers), "each rank's Gloo listens"
        assert {ip for w in workers for ip, _ in w} == {"127.0.0.1"}, workers
        assert all(len(w) == 1 for w in workers), workers  # Gloo only: no TCPStore on rank 0
    assert not os.path.exists(folder)  # close() deletes the directory, store and socket with it


def test_a_non_loopback_host_needs_a_token():
    with pytest.raises(ValueError, match="token"):
        LocalCluster(1, host="0.0.0.0", launch="external")


def test_close_leaves_no_process_thread_or_port():
    threads = _accept_threads()
    c = LocalCluster(2)
    check_dp_run(c)
    pids, address = c.pids, c.address
    c.close()
    assert all(gone(p) for p in pids)
    assert _refused(address)
    assert _accept_threads() == threads
    c.close()  # twice is fine


def test_ctrl_c_during_close_leaves_no_process_behind():
    threads = _accept_threads()
    c = LocalCluster(2)
    check_dp_run(c)
    pids, address = c.pids, c.address
    os.kill(pids[1], signal.SIGSTOP)  # this one will not exit by itself: close() waits for it
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            c.close()
    finally:
        timer.cancel()
    assert all(gone(p) for p in pids)
    assert _refused(address) and _accept_threads() == threads


def test_nothing_is_left_on_disk_even_if_the_driver_is_killed():
    """The activity slots file is unlinked as soon as it is made; workers inherit its descriptor."""
    import tempfile

    before = {f for f in os.listdir(tempfile.gettempdir()) if f.startswith("sbplab-activity-")}
    with LocalCluster(2) as c:
        check_dp_run(c)
        fd = c._board.fd
        assert os.readlink(f"/proc/self/fd/{fd}").endswith("(deleted)")
        for pid in c.pids:  # each worker maps the same, already deleted, file
            maps = open(f"/proc/{pid}/maps").read()
            assert "sbplab-activity-" in maps and "(deleted)" in maps
        after = {f for f in os.listdir(tempfile.gettempdir()) if f.startswith("sbplab-activity-")}
        assert after == before
