"""Messages between driver and workers: plain pickles over an authenticated connection.

``Connection.send`` would use multiprocessing's pickler, which torch extends to pass tensors as
shared-memory file descriptors. That only works between a parent and the children it spawned;
workers started by torchrun (maybe on another machine) need tensors sent by value.
"""

from __future__ import annotations

import pickle
from multiprocessing.connection import Connection
from typing import Any


def send(conn: Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())
