"""Strangers on the driver's socket: garbage, silence, half-open, a wrong token or an oversized hello are
dropped one by one, and the cluster keeps running and respawning as if they were not there. (A spawned
cluster's socket is a Unix socket in a 0700 directory: these strangers are this user's own processes.)"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time

import pytest
from fault_helpers import check_dp_run, connect_raw, join_with, wait_until

from sbplab.runtime import LocalCluster
from sbplab.runtime.handshake import WrongTokenError

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(2) as c:
        c._acceptor.handshake_timeout = 2.0  # a silent peer is cut off quickly in these tests
        yield c


def _connect(cluster) -> socket.socket:
    return connect_raw(cluster.address)


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
    # the silent peer never said it was joining, so it got nothing, then, at the handshake deadline, an
    # end of file
    silent.settimeout(10)
    data = b""
    while chunk := silent.recv(4096):
        data += chunk
    assert data == b""
    wait_until(lambda: cluster._acceptor.rejected >= before + 4, 10, "dropping the four strangers")
    assert cluster._acceptor.running
    for s in (silent, garbage, half_open):
        s.close()
    check_dp_run(cluster)


def test_a_wrong_token_is_refused_counted_and_throttled_and_the_old_fixed_key_is_gone(cluster):
    before = cluster.failed_authentications
    for key in (b"wrong token", b"sbplab-loopback", cluster.token.encode()[:-1]):
        with pytest.raises(WrongTokenError, match="refused"):
            join_with(cluster.address, key)
    assert cluster.failed_authentications == before + 3
    # this process's next challenge comes later and later (doubling), so guessing is throttled
    pauses = [cluster._acceptor._backoff(("pid", os.getpid()))]
    with pytest.raises(WrongTokenError):
        join_with(cluster.address, b"one more guess")
    pauses.append(cluster._acceptor._backoff(("pid", os.getpid())))
    assert 0 < pauses[0] < pauses[1] <= 2.0
    check_dp_run(cluster)


def test_an_authenticated_peer_cannot_send_a_huge_first_message(cluster):
    """Past the challenge, the first message is capped before it is read, let alone unpickled."""
    before = cluster._acceptor.rejected
    conn = join_with(cluster.address, cluster.token.encode())
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


def test_one_peer_holds_at_most_four_handshakes_and_more_are_closed_on_arrival(cluster):
    """Handshake slots are bounded per peer (this process, known through SO_PEERCRED on the Unix socket):
    a fifth silent connection is closed at once while the four before it wait for their deadline, and a
    worker respawn, from other processes, is not held up by them."""
    me = ("pid", os.getpid())
    cluster._acceptor.handshake_timeout = 60.0  # the four outlast this test, however slow the machine
    held = [_connect(cluster) for _ in range(4)]
    wait_until(lambda: cluster._acceptor._pending.get(me) == 4, 10, "four handshakes pending")
    fifth = _connect(cluster)
    fifth.settimeout(10)
    assert fifth.recv(1) == b""  # closed on arrival, long before the handshake deadline
    assert cluster._acceptor._pending.get(me) == 4  # the four still wait
    cluster._kill()
    check_dp_run(cluster)
    for s in held + [fifth]:
        s.close()
    cluster._acceptor.handshake_timeout = 2.0
