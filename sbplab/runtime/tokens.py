"""The cluster's shared secret: random per cluster, handed to workers by environment or file, never argv.

Whoever holds the token can make the driver and every worker unpickle what they send, i.e. run code, so
it is never a constant in the source, never on a command line (``ps`` and ``/proc/*/cmdline`` show those
to every user), and a token file must be readable by its owner only (like ssh keys).
"""

from __future__ import annotations

import math
import os
import secrets
import stat
import string

from ..errors import InputError

TOKEN_ENV = "SBPLAB_TOKEN"
MIN_TOKEN_BITS = 128  # a token that guards a port beyond loopback must be at least this hard to guess
_CLASSES = (string.digits, string.ascii_lowercase, string.ascii_uppercase)


def new_token() -> str:
    """32 random bytes (256 bits) as hex (a str, so it fits an environment variable unchanged)."""
    return secrets.token_bytes(32).hex()


def token_bits(token: str) -> float:
    """An upper estimate of a token's entropy in bits: its length times log2 of the alphabet it seems
    drawn from (hex digits 16; else digits 10, lower 26, upper 26 and ~33 for anything else, by the
    classes it uses). Fewer than 8 distinct characters count once each (``"a" * 40`` is one guess, not
    188 bits). Random tokens of the kind ``secrets`` makes get what they have (``token_hex(16)``: 128,
    ``token_urlsafe(32)``: 256); a human password gets more than it deserves, so this only refuses."""
    if not token:
        return 0.0
    if all(ch in "0123456789abcdef" for ch in token) or all(ch in "0123456789ABCDEF" for ch in token):
        alphabet = 10 if token.isdigit() else 16
    else:
        alphabet = sum(len(c) for c in _CLASSES if any(ch in c for ch in token))
        if any(not any(ch in c for c in _CLASSES) for ch in token):
            alphabet += 33  # punctuation and space (non-ASCII counted the same: a generous guess)
    per_char = math.log2(max(alphabet, 2))
    distinct = len(set(token))
    return (distinct if distinct < 8 else len(token)) * per_char


def check_token_strength(token: str, host: str) -> None:
    """Refuse a user-given token below ``MIN_TOKEN_BITS`` for a driver listening beyond loopback: anyone
    who can reach the port and guesses it can run code in the driver and every worker."""
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise InputError(f"token= is too weak to guard a port on {host!r} (not loopback): about {bits:.0f} bits, "
                         f"at least {MIN_TOKEN_BITS} are needed, since whoever guesses it can run code in the "
                         f"driver and every worker. Make one with python -c 'import secrets; "
                         f"print(secrets.token_urlsafe(32))' (or leave token= out on loopback: a random one)")


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
