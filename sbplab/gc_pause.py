"""Pause Python's cyclic garbage collector while a compiler pass builds its result.

The passes build large graphs of small, long-lived objects (a 24-layer GPT on 8 ranks: 30k physical
op instances, 27k actors, their tuples and dicts). CPython runs a full collection whenever the
objects that survived younger collections grow by a quarter of the long-lived heap, and a full
collection walks every tracked object in the process, torch's included: a large model paid several
of them per compile, about as much time as the passes' own work. The passes make no garbage cycles
that must be reclaimed while they run, so the collector is paused for the pass and resumed after it.

What a pass built is long-lived (the next pass reads it), so on resuming it joins the oldest
generation at once (``gc.freeze()`` then ``gc.unfreeze()``, two list splices) instead of being walked
by the young collection the next allocation would start (tens of milliseconds per pass on a large
model). Nothing is lost: the oldest generation is collected as usual, cycles there included, only no
sooner than the next full collection. A process that keeps its own frozen objects (``gc.freeze`` before
a fork) is left alone: then the pass's objects go through the young collection as before.
Allocation, results and reference counting (which frees almost everything) are unchanged.
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
    already disabled, are left as they are); what the block made then joins the oldest generation."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:  # nobody else keeps a frozen generation (see the module doc)
            gc.freeze()
            gc.unfreeze()
        gc.enable()


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a pass so it runs inside ``gc_paused``."""

    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return fn(*args, **kwargs)

    return run
