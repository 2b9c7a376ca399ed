"""Lanes: where firings run. The compute lane is the scheduler's own thread; the comm lane is made of
the backend's threads and a small pool of waiters.

On CPU, Gloo progresses posted operations on its own threads and the pool waits for them, so
several transfers are in flight while the compute lane keeps computing.
On CUDA each lane also owns a stream: a firing makes its lane's stream wait on the events of its
inputs and records an event for its outputs, so the CPU only enqueues work and never waits for
the GPU; NCCL's ``wait()`` is itself a stream wait, so the comm lane needs no waiter pool.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .comm import Comm
from .specs import Actor, Collective


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

    def wait_for(self, stream, events: list) -> None:
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

    def start_clock(self) -> None:
        """On CUDA, firing times come from events measured against this reference."""
        if self.cuda:
            torch.cuda.synchronize()
            self.t0_event = torch.cuda.Event(enable_timing=True)
            self.t0_event.record()
            torch.cuda.synchronize()
            self.t0_ns = time.perf_counter_ns()

    def to_ns(self, ev) -> int:
        ev.synchronize()
        return self.t0_ns + int(self.t0_event.elapsed_time(ev) * 1e6)  # type: ignore[union-attr]


class CommLane:
    """The comm lane: posts communication in the order it is submitted, reports completions to ``inbox``.

    Posting never blocks (Gloo and NCCL operations are asynchronous), so it happens right away on
    the submitting thread, in order, without a thread hop on the critical path of a transfer.
    Completion is where the lane's threads come in: a collective's future calls back from Gloo's
    own thread, and a point-to-point transfer is waited for by a pool thread. On CUDA the post
    goes onto the comm stream and ``wait()`` is a stream wait, so it completes at once for the CPU.

    Each completion is ``("done", node, k, outputs, event, t0_ns, t1_ns, nbytes, cuda_timing)``; a
    failure is ``("error", node, k, exception, traceback_text)``.
    """

    def __init__(self, comm: Comm, streams: Streams, inbox: queue.SimpleQueue, micro_batches: int) -> None:
        self.comm, self.streams, self.inbox, self.micro = comm, streams, inbox, micro_batches
        self.pool = None if streams.cuda else ThreadPoolExecutor(16, thread_name_prefix="sbplab-comm-lane")
        self.inflight: dict[tuple[int, int], tuple[int, str]] = {}  # (node, k) -> (t0_ns, label)
        self.lock = threading.Lock()

    def submit(self, node: int, k: int, actor: Actor, micro: int, x: torch.Tensor | None, event: Any,
               inplace: bool = False) -> None:
        t0 = time.perf_counter_ns()
        with self.lock:
            self.inflight[(node, k)] = (t0, actor.label)
        try:
            with self.streams.use(self.streams.comm):
                self.streams.wait_for(self.streams.comm, [event])
                if self.streams.cuda and x is not None:
                    x.record_stream(self.streams.comm)
                sev = self.streams.record(self.streams.comm)
                pend = self.comm.post(actor, x, self.micro, micro, inplace)
                if self.streams.cuda:
                    out = pend.wait()  # a stream wait, not a CPU one
                    ev = self.streams.record(self.streams.comm)
                    self._done(node, k, out, ev, t0, pend.nbytes, (sev, ev))
                    return
        except BaseException as e:  # noqa: BLE001 - reported to the driver with its traceback
            self.inbox.put(("error", node, k, e, traceback.format_exc()))
            return
        fut = None
        if isinstance(actor, Collective) and pend.work is not None:
            try:
                fut = pend.work.get_future()  # type: ignore[attr-defined]
            except RuntimeError:  # this backend has no futures for it
                fut = None
        if fut is not None:  # completes on the backend's thread, no waiter needed
            fut.add_done_callback(
                lambda f, node=node, k=k, pend=pend, t0=t0: self._future_done(f, node, k, pend, t0))
        else:
            self.pool.submit(self._wait, node, k, pend, t0)  # type: ignore[union-attr]

    def _future_done(self, fut, node: int, k: int, pend, t0: int) -> None:
        try:
            fut.value()
            pend.work = None
            out = pend.wait()
        except BaseException as e:  # noqa: BLE001
            self.inbox.put(("error", node, k, e, traceback.format_exc()))
            return
        self._done(node, k, out, None, t0, pend.nbytes)

    def _wait(self, node: int, k: int, pend, t0: int) -> None:
        try:
            out = pend.wait()
        except BaseException as e:  # noqa: BLE001
            self.inbox.put(("error", node, k, e, traceback.format_exc()))
            return
        self._done(node, k, out, None, t0, pend.nbytes)

    def _done(self, node: int, k: int, out, ev, t0: int, nbytes: int, timing=None) -> None:
        with self.lock:
            self.inflight.pop((node, k), None)
        outs = () if out is None else (out,)
        self.inbox.put(("done", node, k, outs, ev, t0, time.perf_counter_ns(), nbytes, timing))

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
