"""The driver's listening socket: every connection is authenticated in its own thread, bounded in time and size.

Driver and workers exchange pickles, so nothing a peer sends is unpickled before it has proved it
holds the cluster's token (multiprocessing's HMAC challenge, compared in constant time). A peer that
sends garbage, says nothing, or connects and closes costs one short-lived thread: the accept loop never
reads from a socket itself, so it cannot be blocked or killed by one. After the challenge, the first
message (the worker's hello) is capped in size and must arrive before the same deadline.

Accepted workers come out of ``incoming`` as ``(Connection, hello)`` pairs.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import threading
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

HANDSHAKE_TIMEOUT_S = 10.0  # challenge + hello, all of it, per connection
MAX_HELLO_BYTES = 64 * 1024  # a hello is a small dict; anything bigger is not one of ours
MAX_PENDING = 64  # connections being authenticated at once; more are dropped on arrival


def listen_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP listening socket on exactly ``host`` (never the wildcard unless the caller names it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class Acceptor:
    """Accepts on ``server`` in a thread until ``close()``; authenticated hellos go to ``incoming``."""

    def __init__(self, server: socket.socket, token: bytes, incoming: queue.SimpleQueue,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.server, self.token, self.incoming = server, token, incoming
        self.handshake_timeout = handshake_timeout
        self.address: tuple[str, int] = server.getsockname()[:2]
        self.rejected = 0  # connections dropped (bad token, garbage, silence, too big): for tests and repr
        self._stop = threading.Event()
        self._count_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_PENDING)
        server.settimeout(0.2)  # the loop wakes up to notice close()
        self._thread = threading.Thread(target=self._loop, name="sbplab-accept", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue  # e.g. ECONNABORTED: a peer that gave up while queued
            if not self._slots.acquire(blocking=False):
                sock.close()
                with self._count_lock:
                    self.rejected += 1
                continue
            threading.Thread(target=self._handshake, args=(sock,), name="sbplab-handshake", daemon=True).start()

    def _handshake(self, sock: socket.socket) -> None:
        """Challenge, then the hello; a watchdog shuts the socket at the deadline, waking any blocked read."""
        sock.setblocking(True)
        conn = Connection(os.dup(sock.fileno()))
        watchdog = threading.Timer(self.handshake_timeout, _shutdown, args=(sock,))
        watchdog.daemon = True
        watchdog.start()
        try:
            deliver_challenge(conn, self.token)
            answer_challenge(conn, self.token)
            hello = pickle.loads(conn.recv_bytes(MAX_HELLO_BYTES))  # authenticated peer, bounded size
            if not (isinstance(hello, tuple) and len(hello) == 2 and hello[0] == "hello"
                    and isinstance(hello[1], dict)):
                raise ValueError(f"expected a hello, got {type(hello).__name__}")
        except Exception:  # noqa: BLE001 - bad token, garbage, silence, EOF: drop this peer only
            conn.close()
            with self._count_lock:
                self.rejected += 1
            return
        finally:
            watchdog.cancel()
            sock.close()  # conn holds its own descriptor of the same connection
            self._slots.release()
        if self._stop.is_set():
            conn.close()
            return
        self.incoming.put((conn, hello[1]))

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
