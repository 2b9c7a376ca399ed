"""gc_paused: what a pass built joins the oldest generation untraversed, and nothing leaks.

Survivors of a paused block are moved to the oldest generation when the collector resumes, so the
young collection that would walk all of them does not happen. Cycles made inside the block must still
be reclaimed (by a full collection), and objects another part of the process froze stay frozen.
"""

from __future__ import annotations

import gc
import weakref

from sbplab.gc_pause import gc_paused


class _Cell:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_survivors_join_the_oldest_generation():
    gc.collect()
    with gc_paused():
        kept = [[i] for i in range(1000)]  # lists stay tracked (dicts of ints would not be)
    assert gc.isenabled()
    assert gc.get_count()[0] < 700  # no young collection pending for the block's objects
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(kept) in oldest and id(kept[0]) in oldest
    assert gc.get_freeze_count() == 0


def test_cycles_made_in_a_block_are_still_collected():
    gc.collect()
    with gc_paused():
        ref = weakref.ref(_Cell())
    assert ref() is not None  # a cycle: reference counting alone cannot free it
    gc.collect()
    assert ref() is None


def test_objects_frozen_by_others_stay_frozen():
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_paused():
            kept = [{"i": i} for i in range(100)]
        # their permanent generation is untouched: not unfrozen (it would drop to 0), nothing added to it;
        # a frozen object another thread frees meanwhile leaves it, so it may be a few smaller
        assert frozen - 1000 <= gc.get_freeze_count() <= frozen
        assert kept[-1]["i"] == 99
    finally:
        gc.unfreeze()
