"""The join handshake: a worker and the driver prove to each other that they hold the cluster's token.

Why not multiprocessing's challenge: on Python 3.11 it is HMAC-MD5 compared with ``==`` (not in
constant time), and a refused peer learns nothing the driver can name. Here both sides send a fresh
32-byte nonce, each answers with HMAC-SHA256 over both nonces and its role (so an answer cannot be
reflected back), and every digest is checked with ``hmac.compare_digest``. The worker also says which
rank it claims to be, before proving anything: the claim is never trusted, it only lets the driver's
error say "worker rank N presented a wrong token" when a worker was started with a mistyped token.

Messages use ``Connection.send_bytes``/``recv_bytes`` framing with a small cap on every read, so
nothing of a peer's is unpickled or buffered without bound before it has proved itself.

    worker -> driver   MAGIC, rank (8 bytes, signed), nonce_w
    driver -> worker   CHALLENGE, nonce_d                      (after the peer's back-off, if it failed before)
    worker -> driver   HMAC(token, b"worker" + nonce_w + nonce_d)
    driver -> worker   REFUSED                                 (wrong token: the driver counts it)
                    or WELCOME, HMAC(token, b"driver" + nonce_d + nonce_w)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection

MAGIC = b"sbplab-join-1"
CHALLENGE = b"sbplab-challenge"
WELCOME = b"sbplab-welcome"
REFUSED = b"sbplab-refused"
NONCE_BYTES = 32
_MAX_MSG = 128  # every handshake message is shorter


class WrongTokenError(Exception):
    """The other side does not hold this token (raised on the side that found out)."""


class NotAJoin(Exception):
    """The peer did not open with a join message (a stranger, a port scanner, an old client)."""


def _mac(token: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(token, role + a + b, hashlib.sha256).digest()


def read_join(conn: Connection) -> tuple[int, bytes]:
    """The driver's first read: (claimed rank, the worker's nonce)."""
    msg = conn.recv_bytes(_MAX_MSG)
    if not msg.startswith(MAGIC) or len(msg) != len(MAGIC) + 8 + NONCE_BYTES:
        raise NotAJoin(f"not a join message ({len(msg)} bytes)")
    (rank,) = struct.unpack("!q", msg[len(MAGIC):len(MAGIC) + 8])
    return rank, msg[len(MAGIC) + 8:]


def driver_side(conn: Connection, token: bytes, nonce_w: bytes, refused: Callable[[], None] | None = None) -> None:
    """Challenge a joined peer; raise WrongTokenError (after telling it) if its answer is wrong.
    ``refused()`` runs before the peer is told, so whoever counts refusals has counted this one by then."""
    nonce_d = os.urandom(NONCE_BYTES)
    conn.send_bytes(CHALLENGE + nonce_d)
    answer = conn.recv_bytes(_MAX_MSG)
    if not hmac.compare_digest(answer, _mac(token, b"worker", nonce_w, nonce_d)):
        if refused is not None:
            refused()
        try:
            conn.send_bytes(REFUSED)
        except OSError:
            pass
        raise WrongTokenError("the peer's answer does not match this cluster's token")
    conn.send_bytes(WELCOME + _mac(token, b"driver", nonce_d, nonce_w))


def _recv_within(conn: Connection, timeout: float) -> bytes:
    if not conn.poll(timeout):
        raise TimeoutError(f"no answer from the driver within {timeout:.0f} s")
    return conn.recv_bytes(_MAX_MSG)


def worker_side(conn: Connection, token: bytes, rank: int, timeout: float = 30.0) -> None:
    """Join as ``rank`` (-1: unknown yet); WrongTokenError if the driver refuses our token or cannot
    prove it holds it. EOFError/OSError (TimeoutError after ``timeout`` s per answer): the driver dropped
    us before a verdict, or is slow: try again."""
    nonce_w = os.urandom(NONCE_BYTES)
    conn.send_bytes(MAGIC + struct.pack("!q", rank) + nonce_w)
    msg = _recv_within(conn, timeout)
    if not msg.startswith(CHALLENGE) or len(msg) != len(CHALLENGE) + NONCE_BYTES:
        raise WrongTokenError("the peer at the driver's address is not an sbplab driver")
    nonce_d = msg[len(CHALLENGE):]
    conn.send_bytes(_mac(token, b"worker", nonce_w, nonce_d))
    verdict = _recv_within(conn, timeout)
    if verdict == REFUSED:
        raise WrongTokenError("the driver refused this worker's token")
    if not (verdict.startswith(WELCOME) and hmac.compare_digest(
            verdict[len(WELCOME):], _mac(token, b"driver", nonce_d, nonce_w))):
        raise WrongTokenError("the driver could not prove it holds the token (not this cluster's driver?)")
