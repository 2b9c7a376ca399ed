"""The cluster's shared secret: random per cluster, handed to workers by environment or file, never argv.

Whoever holds the token can make the driver and every worker unpickle what they send, i.e. run code, so
it is never a constant in the source, never on a command line (``ps`` and ``/proc/*/cmdline`` show those
to every user), and a token file must be readable by its owner only (like ssh keys).
"""

from __future__ import annotations

import os
import secrets
import stat

TOKEN_ENV = "SBPLAB_TOKEN"


def new_token() -> str:
    """32 random bytes as hex (a str, so it fits an environment variable unchanged)."""
    return secrets.token_bytes(32).hex()


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); refuses files others can read."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise SystemExit(f"sbplab.worker: cannot read the token file {path!r}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SystemExit(f"sbplab.worker: the token file {path!r} is readable by others "
                         f"(mode {stat.filemode(st.st_mode)}); run `chmod 600 {path}`")
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if not token:
        raise SystemExit(f"sbplab.worker: the token file {path!r} is empty")
    return token


def worker_token(token_file: str | None) -> str:
    """The token from ``--token-file`` or ``$SBPLAB_TOKEN``; removed from the environment once read, so
    processes the worker's kernels start do not inherit it. No token: a clear error, never a default."""
    env = os.environ.pop(TOKEN_ENV, None)
    if token_file:
        return read_token_file(token_file)
    if env:
        return env
    raise SystemExit(f"sbplab.worker: no token. Driver and workers exchange pickles, so a worker only "
                     f"joins with the cluster's shared secret: set ${TOKEN_ENV} or pass --token-file PATH "
                     f"(a file only you can read). The driver's token is LocalCluster(...).token.")
