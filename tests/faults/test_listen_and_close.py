"""Sockets: the driver, the rendezvous store and Gloo listen on loopback only; ``close()`` leaves no
process, thread or port behind, even when Ctrl-C interrupts it."""

from __future__ import annotations

import _thread
import os
import signal
import socket
import threading

import pytest
from fault_helpers import check_dp_run, gone, listening

from sbplab.runtime import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(120)]


def _accept_threads() -> int:
    return sum(t.name == "sbplab-accept" and t.is_alive() for t in threading.enumerate())


def _refused(address) -> bool:
    try:
        socket.create_connection(address, timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_driver_store_and_gloo_listen_on_loopback_only():
    with LocalCluster(2) as c:
        check_dp_run(c)
        driver = {ip for ip, port in listening(os.getpid()) if port == c.address[1]}
        assert driver == {"127.0.0.1"}
        workers = set().union(*(listening(pid) for pid in c.pids))
        assert workers, "rank 0 should listen (the rendezvous store) and Gloo too"
        assert {ip for ip, _ in workers} == {"127.0.0.1"}, workers


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
