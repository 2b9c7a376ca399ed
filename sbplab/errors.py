"""One family of errors: every error sbplab raises on purpose is an ``SbplabError``.

Why one base: a notebook or a script can tell "sbplab refused this input, and says why" from a bug
(an internal TypeError, IndexError or KeyError escaping) with one ``except sl.SbplabError``. Each
class also keeps the builtin base it always had (``LayoutError`` is still a ``ValueError``,
``UnknownOpError`` a ``KeyError``, ``RunError`` a ``RuntimeError``), so older ``except ValueError``
code keeps working.

The specific errors live next to the rule they enforce (``LayoutError`` in ``layout.py``,
``BoxingError`` in ``boxing/route.py``, ...); the generic ones below are for bad arguments that no
more specific class describes. Every message says what was wrong, on which op or tensor, and what
would be valid.
"""

from __future__ import annotations


class SbplabError(Exception):
    """Base of every error sbplab raises on purpose: bad input, a plan that cannot run, a failed run.

    Anything else escaping the public API is a bug. Messages are sentences, so ``str()`` gives the
    message as written even for the ``KeyError`` subclasses (whose builtin ``str`` would quote it).
    """

    def __str__(self) -> str:
        return Exception.__str__(self)


class InputError(SbplabError, ValueError):
    """An argument has the right type but a wrong value (out of range, malformed, inconsistent)."""


class InputTypeError(SbplabError, TypeError):
    """An argument has the wrong type; the message names the argument and the types that would do."""


class SbpError(InputError):
    """An SBP that cannot be parsed, or that does not fit the mesh or the tensor it is given for."""


class OpError(InputError):
    """An op cannot take these inputs or attributes: the message starts with the op's name."""


class ClusterError(SbplabError, RuntimeError):
    """A cluster cannot take this request in its current state (closed, its external workers gone)."""


class InputKeyError(SbplabError, KeyError):
    """A name or rank that is not there (a rank outside the placement); the message lists what is."""
