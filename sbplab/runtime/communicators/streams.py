"""Streams: the CUDA streams and events of the runtime's two lanes (compute, comm); every method is a
no-op off CUDA, so the runtime calls them unconditionally instead of asking ``if cuda``.

On CUDA a firing makes its lane's stream wait on its inputs' events and records an event for its
outputs, so the CPU only enqueues work; NCCL runs on the comm stream.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch


class Streams:
    """CUDA streams and events of the two lanes; on CPU every method is a no-op."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.compute = torch.cuda.Stream(device) if self.cuda else None
        self.comm = torch.cuda.Stream(device) if self.cuda else None
        self.t0_event = None
        self.t0_ns = 0

    def use(self, stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def wait_for(self, stream, events: Iterable) -> None:
        if self.cuda:
            for ev in events:
                if ev is not None:
                    stream.wait_event(ev)

    def record(self, stream):
        if not self.cuda:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def hold(self, tensors: Iterable[torch.Tensor | None], stream) -> None:
        """Tensors made on another stream and used on ``stream``: keep their memory until that use is done."""
        if self.cuda:
            for x in tensors:
                if x is not None:
                    x.record_stream(stream)

    def run_on(self, stream, events: list, xs: list[torch.Tensor], fn: Callable[[], Any]) -> tuple[Any, Any, Any]:
        """``fn()`` enqueued on ``stream`` after ``events``, ``xs`` held for it: (start event, result, end
        event); off CUDA simply (None, fn(), None)."""
        if not self.cuda:
            return None, fn(), None
        with self.use(stream):
            self.wait_for(stream, events)
            self.hold(xs, stream)
            sev = self.record(stream)
            out = fn()
            return sev, out, self.record(stream)

    def mark(self, stream):
        """A point in time on ``stream``: a CUDA event (read after the run, ``resolve``), else ``perf_counter_ns``."""
        return self.record(stream) if self.cuda else time.perf_counter_ns()

    def log(self, trace: list[tuple], timing: list[tuple], entry: tuple, start, end) -> None:
        """Append ``entry + (start, end, bytes)`` to ``trace``, ``entry = (actor, firing, lane)`` and
        ``start``/``end`` from ``mark`` (or ``run_on``); on CUDA the times are filled in by ``resolve``.
        ``entry`` may carry the bytes as a fourth item."""
        head, nbytes = entry[:3], (entry[3] if len(entry) > 3 else 0)
        if self.cuda:
            trace.append(head + (0, 0, nbytes))
            timing.append((len(trace) - 1, start, end))
        else:
            trace.append(head + (start, end, nbytes))

    def resolve(self, trace: list[tuple], timing: list[tuple]) -> None:
        """After a run: trace entries ``timing`` names (index, start event, end event) get their event
        times; nothing to do off CUDA, where times were taken on the spot."""
        if not self.cuda:
            return
        torch.cuda.synchronize()
        for idx, sev, eev in timing:
            i, k, lane, _, _, nb = trace[idx]
            trace[idx] = (i, k, lane, self.to_ns(sev), self.to_ns(eev), nb)

    def start_clock(self) -> None:
        """On CUDA, firing times come from events measured against this reference."""
        if self.cuda:
            torch.cuda.synchronize()
            self.t0_event = torch.cuda.Event(enable_timing=True)
            self.t0_event.record()
            torch.cuda.synchronize()
            self.t0_ns = time.perf_counter_ns()

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def to_ns(self, ev) -> int:
        ev.synchronize()
        return self.t0_ns + int(self.t0_event.elapsed_time(ev) * 1e6)  # type: ignore[union-attr]
