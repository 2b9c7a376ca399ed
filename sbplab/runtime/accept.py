"""The driver's listening socket: every connection is authenticated in its own thread, bounded in time and size.

Driver and workers exchange pickles, so nothing a peer sends is unpickled before it has proved it
holds the cluster's token (``handshake``: HMAC-SHA256 both ways, checked with ``hmac.compare_digest``).
A peer that sends garbage, says nothing, or connects and closes costs one short-lived thread: the accept
loop never reads from a socket itself, so it cannot be blocked or killed by one.

Handshake slots cannot be starved: one peer (a process, for the Unix socket of a spawned cluster, found
with SO_PEERCRED; an IP address over TCP) may have at most ``MAX_PENDING_PER_PEER`` connections in the
handshake, and each has ``HANDSHAKE_TIMEOUT_S`` for all of it; more are closed on arrival (a worker
dropped so retries its join). A peer that presented a wrong token waits longer before each new challenge
(doubling, up to ``MAX_BACKOFF_S``), so guessing is throttled; failures are counted and the claimed rank
of each is kept, for the error that says "worker rank N presented a wrong token".

Accepted workers come out of ``incoming`` as ``(Connection, hello)`` pairs.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection

from .handshake import driver_side, read_join

HANDSHAKE_TIMEOUT_S = 3.0  # join, challenge, answer and hello, all of it, per connection
MAX_HELLO_BYTES = 64 * 1024  # a hello is a small dict; anything bigger is not one of ours
MAX_PENDING = 64  # connections being authenticated at once; more are dropped on arrival
MAX_PENDING_PER_PEER = 4  # of those, from one process (Unix socket) or one address (TCP)
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.05, 2.0  # wait before challenging a peer that failed before
MAX_WRONG_TOKENS_KEPT = 32


def listen_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP listening socket on exactly ``host`` (never the wildcard unless the caller names it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


def listen_unix(path: str, backlog: int) -> socket.socket:
    """A Unix socket at ``path`` (in a 0700 directory: only its owner, and root, can connect)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        server.listen(backlog)
    except BaseException:
        server.close()
        raise
    return server


def _peer(sock: socket.socket, addr) -> tuple[object, str]:
    """(key for the per-peer bounds, words for messages) of an accepted connection."""
    if sock.family == getattr(socket, "AF_UNIX", None):
        cred = getattr(socket, "SO_PEERCRED", None)
        if cred is not None:
            try:
                pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, cred, struct.calcsize("3i")))
                return ("pid", pid), f"process {pid} (uid {uid})"
            except OSError:
                pass
        return ("unix",), "a local process"
    ip = addr[0] if isinstance(addr, tuple) and addr else "?"
    return ("ip", ip), ip


class Acceptor:
    """Accepts on ``server`` in a thread until ``close()``; authenticated hellos go to ``incoming``."""

    def __init__(self, server: socket.socket, token: bytes, incoming: queue.SimpleQueue,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.server, self.token, self.incoming = server, token, incoming
        self.handshake_timeout = handshake_timeout
        name = server.getsockname()
        self.address: tuple[str, int] | str = name if isinstance(name, str) else tuple(name[:2])
        self.rejected = 0  # connections dropped (bad token, garbage, silence, too big, over a bound)
        self.failed_auth = 0  # connections that answered the challenge with a wrong token
        self.wrong_tokens: list[tuple[int, str]] = []  # (claimed rank, peer) of the latest of those
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[object, int] = {}  # peer -> connections in the handshake
        self._failures: dict[object, int] = {}  # peer -> wrong tokens presented
        server.settimeout(0.2)  # the loop wakes up to notice close()
        self._thread = threading.Thread(target=self._loop, name="sbplab-accept", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, addr = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.01)  # e.g. EMFILE under a flood: do not spin
                continue
            key, who = _peer(sock, addr)
            with self._lock:
                busy = self._pending.get(key, 0) >= MAX_PENDING_PER_PEER or \
                    sum(self._pending.values()) >= MAX_PENDING
                if busy:
                    self.rejected += 1
                else:
                    self._pending[key] = self._pending.get(key, 0) + 1
            if busy:
                sock.close()
                continue
            threading.Thread(target=self._handshake, args=(sock, key, who), name="sbplab-handshake",
                             daemon=True).start()

    def _count_wrong_token(self, key: object, rank: int, who: str) -> None:
        with self._lock:
            self.failed_auth += 1
            self._failures[key] = self._failures.get(key, 0) + 1
            self.wrong_tokens = (self.wrong_tokens + [(rank, who)])[-MAX_WRONG_TOKENS_KEPT:]

    def _backoff(self, key: object) -> float:
        with self._lock:
            k = self._failures.get(key, 0)
        return 0.0 if k == 0 else min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (k - 1))

    def _handshake(self, sock: socket.socket, key: object, who: str) -> None:
        """Join, challenge, then the hello; a watchdog shuts the socket at the deadline, waking any
        blocked read."""
        sock.setblocking(True)
        conn = Connection(os.dup(sock.fileno()))
        watchdog = threading.Timer(self.handshake_timeout, _shutdown, args=(sock,))
        watchdog.daemon = True
        watchdog.start()
        rank = -1
        try:
            rank, nonce = read_join(conn)
            wait = self._backoff(key)
            if wait and self._stop.wait(wait):
                raise EOFError("closing")
            driver_side(conn, self.token, nonce, refused=lambda: self._count_wrong_token(key, rank, who))
            hello = pickle.loads(conn.recv_bytes(MAX_HELLO_BYTES))  # authenticated peer, bounded size
            if not (isinstance(hello, tuple) and len(hello) == 2 and hello[0] == "hello"
                    and isinstance(hello[1], dict)):
                raise ValueError(f"expected a hello, got {type(hello).__name__}")
        except Exception:  # noqa: BLE001 - bad token, garbage, silence, EOF: drop this peer only
            conn.close()
            with self._lock:
                self.rejected += 1
            return
        finally:
            watchdog.cancel()
            sock.close()  # conn holds its own descriptor of the same connection
            with self._lock:
                left = self._pending.get(key, 1) - 1
                if left:
                    self._pending[key] = left
                else:
                    self._pending.pop(key, None)
        if self._stop.is_set():
            conn.close()
            return
        self.incoming.put((conn, hello[1]))

    def report(self) -> str:
        """Failed authentications in words, for an error about workers that did not join ("" if none)."""
        with self._lock:
            failed, wrong = self.failed_auth, list(self.wrong_tokens)
        if not failed:
            return ""
        named = sorted({r for r, _ in wrong if r >= 0})
        parts = [f"worker rank {r} presented a wrong token (check $SBPLAB_TOKEN or --token-file)" for r in named]
        parts.append(f"{failed} connection{'s' if failed != 1 else ''} failed to authenticate")
        return "; ".join(parts)

    def close(self) -> None:
        """Stop accepting and close the port; returns once the accept thread has ended."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
