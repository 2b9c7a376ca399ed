"""Which firings of a trace fire ahead: they read nothing their step computed.

Sources, constants and zero fills have no inputs, so the runtime fires them as soon as one of their
registers is free, often deep inside the previous step; so do the kernels that only read them (a
reshape of a constant). A timeline of one step should start where the step's real work does, so
these are told apart using the trace's register flows (Chrome ``s``/``f`` events: the arrow from
the firing that wrote a register to the one that read it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any


def ahead_of(events: Sequence[dict], bars: Sequence[Any], where: Sequence[tuple[Any, Any]],
             pairs: Sequence[tuple[int, int]] | None = None) -> list[bool] | None:
    """Per bar: True when it reads no input, or only inputs of firings that are themselves ahead;
    communication is never ahead. None when the trace has no flows (nothing to tell by).

    ``where`` is each bar's (pid, tid): a flow starts inside its producer's slice on that thread
    (``s`` at the slice's end) and ends at its consumer's start (``f``); ``pairs``: ``flow_pairs`` of
    the same, when the caller has them already.
    """
    if not any(e.get("ph") == "f" and "id" in e for e in events):
        return None
    inputs: dict[int, list[int]] = {}
    for consumer, producer in (flow_pairs(events, bars, where) if pairs is None else pairs):
        inputs.setdefault(consumer, []).append(producer)
    memo: dict[int, bool] = {}
    for root in range(len(bars)):  # depth first without recursion: chains run thousands of firings long
        stack = [root]
        while stack:
            i = stack[-1]
            if i in memo:
                stack.pop()
                continue
            todo = [p for p in inputs.get(i, ()) if p not in memo and p not in stack]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[i] = bars[i].lane != "comm" and all(memo.get(p, False) for p in inputs.get(i, ()))
    return [memo[i] for i in range(len(bars))]


def flow_pairs(events: Sequence[dict], bars: Sequence[Any], where: Sequence[tuple[Any, Any]]) -> list[tuple[int, int]]:
    """(consumer, producer) bar indices of every flow whose two ends are drawn firings."""
    starts = {e["id"]: (e.get("pid"), e.get("tid"), e.get("ts")) for e in events if e.get("ph") == "s" and "id" in e}
    ends = [(e["id"], (e.get("pid"), e.get("tid"), e.get("ts"))) for e in events if e.get("ph") == "f" and "id" in e]
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, int]]] = {}
    for i, (b, w) in enumerate(zip(bars, where)):
        by_thread.setdefault(w, []).append((b.start_us, b.end_us, i))
    for slices in by_thread.values():
        slices.sort()

    def find(pid: Any, tid: Any, ts: Any, at_start: bool) -> int | None:
        slices = by_thread.get((pid, tid))
        if not slices or ts is None:
            return None
        k = bisect.bisect_right(slices, (ts, float("inf"), len(bars))) - 1
        if k < 0:
            return None
        s, e, i = slices[k]
        if at_start:
            return i if s == ts else None
        return i if s <= ts <= e + 1e-3 else None

    out = []
    for fid, (pid, tid, ts) in ends:
        consumer = find(pid, tid, ts, True)
        src = starts.get(fid)
        producer = find(*src, False) if src is not None else None
        if consumer is not None and producer is not None:
            out.append((consumer, producer))
    return out
