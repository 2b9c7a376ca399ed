"""Pause Python's cyclic garbage collector while a compiler pass builds its result.

The passes build large graphs of small, long-lived objects (a 24-layer GPT on 8 ranks: 30k physical
op instances, 27k actors, their tuples and dicts). CPython runs a full collection whenever the
objects that survived younger collections grow by a quarter of the long-lived heap, and a full
collection walks every tracked object in the process, torch's included: a large model paid several
of them per compile, about as much time as the passes' own work. The passes make no garbage cycles
that must be reclaimed while they run, so the collector is paused for the pass and resumed after it,
and collects then whatever it would have found. Nothing else changes: allocation, results and
reference counting (which frees almost everything) are as before.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cyclic collection inside the block (nested blocks, and a collector the caller
    already disabled, are left as they are)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a pass so it runs inside ``gc_paused``."""

    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return fn(*args, **kwargs)

    return run
