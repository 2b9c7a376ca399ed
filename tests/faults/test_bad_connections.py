"""Strangers on the driver's port: garbage, silence, half-open, a wrong token or an oversized hello are
dropped one by one, and the cluster keeps running and respawning as if they were not there."""

from __future__ import annotations

import pickle
import socket
import struct
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest
from fault_helpers import check_dp_run, wait_until

from sbplab.runtime import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(2) as c:
        c._acceptor.handshake_timeout = 2.0  # a silent peer is cut off quickly in these tests
        yield c


def _connect(cluster) -> socket.socket:
    return socket.create_connection(cluster.address, timeout=10)


def test_garbage_silent_and_half_open_connections_do_not_harm_the_cluster(cluster):
    before = cluster._acceptor.rejected
    silent = _connect(cluster)  # says nothing, stays open through the run
    garbage = _connect(cluster)
    garbage.sendall(b"\xff" * 4096 + b"GET / HTTP/1.1\r\n\r\n")
    half_open = _connect(cluster)
    half_open.shutdown(socket.SHUT_WR)  # we will never write again
    closed = _connect(cluster)
    closed.close()  # connects and goes
    check_dp_run(cluster)
    # the silent peer got the challenge and then, at the handshake deadline, an end of file
    silent.settimeout(10)
    data = b""
    while chunk := silent.recv(4096):
        data += chunk
    assert data  # the challenge came, then the driver hung up
    wait_until(lambda: cluster._acceptor.rejected >= before + 4, 10, "dropping the four strangers")
    assert cluster._acceptor.running
    for s in (silent, garbage, half_open):
        s.close()
    check_dp_run(cluster)


def test_a_wrong_token_is_refused_and_the_old_fixed_key_is_gone(cluster):
    for key in (b"wrong token", b"sbplab-loopback"):
        with pytest.raises(AuthenticationError):
            Client(cluster.address, authkey=key)
    check_dp_run(cluster)


def test_an_authenticated_peer_cannot_send_a_huge_first_message(cluster):
    """Past the challenge, the first message is capped before it is read, let alone unpickled."""
    before = cluster._acceptor.rejected
    conn = Client(cluster.address, authkey=cluster.token.encode())
    big = pickle.dumps(("hello", {"pad": b"x" * (1 << 20)}))
    try:
        conn.send_bytes(big)
    except OSError:
        pass  # the driver may hang up while we still write
    wait_until(lambda: cluster._acceptor.rejected > before, 10, "dropping the oversized hello")
    conn.close()
    check_dp_run(cluster)


def test_workers_respawn_while_strangers_hold_connections_open(cluster):
    """Silent peers occupy only their own handshake threads: a respawn still gets every worker in."""
    silent = [_connect(cluster) for _ in range(8)]
    trickle = _connect(cluster)
    trickle.sendall(struct.pack("!i", 1 << 30))  # announces 1 GiB, sends nothing more
    old = cluster.pids
    cluster._kill()  # as after a failed run
    assert not cluster.alive
    t0 = time.monotonic()
    check_dp_run(cluster)
    assert set(cluster.pids).isdisjoint(old) and time.monotonic() - t0 < 60
    for s in silent + [trickle]:
        s.close()
