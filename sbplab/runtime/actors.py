"""What one firing of each kind of actor does, given its input tensors (the wiring is in executor.py)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .buffers import BufferPools
from .fusion import Fused
from .specs import Accumulate, Actor, Compute, PlanError, Sink, Source, State, materialize

Kernel = Callable[[list, dict], Sequence[torch.Tensor]]
Into = Callable[[list, dict, torch.Tensor], None]


def resolve_kernel(op: str) -> Kernel:
    """A registry op's kernel, or ``"package.module:function"`` imported on the worker."""
    if ":" in op:
        mod, _, fn = op.partition(":")
        try:
            return getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise PlanError(f"kernel {op!r} cannot be imported on the worker: {e}") from e
    from ..ops import get_op

    return get_op(op).kernel


def resolve_into(op: str) -> Into | None:
    """The kernel's way to write its one output into a given tensor (``OpDef.kernel_into``, or a plain
    kernel's ``into`` attribute), or None: it only returns tensors of its own."""
    if ":" in op:
        return getattr(resolve_kernel(op), "into", None)
    from ..ops import get_op

    return get_op(op).kernel_into


class Behaviour:
    """Per-actor state during one run; ``fire(k, inputs)`` returns the outputs (maybe none)."""

    def __init__(self, actor: Actor, micro: int, steps: int, device: torch.device) -> None:
        self.actor, self.micro, self.steps, self.device = actor, micro, steps, device

    def fire(self, k: int, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        raise NotImplementedError


class ComputeB(Behaviour):
    def __init__(self, actor: Compute, micro: int, steps: int, device: torch.device,
                 views: list[torch.Tensor] | None = None) -> None:
        super().__init__(actor, micro, steps, device)
        self.kernel = resolve_kernel(actor.op)
        self.attrs = dict(actor.attrs)
        self.n = actor.outputs
        self.views = views  # ``into``: the output's view in each buffer of its pool
        self.into = resolve_into(actor.op) if views else None

    def fire(self, k, inputs):
        views = self.views
        if views is not None:  # output k lives in buffer k % count (``buffers.py``)
            return self._into(views[k % len(views)], inputs)
        out = self.kernel(inputs, self.attrs)
        if type(out) is not tuple:
            out = tuple(out) if isinstance(out, list) else (out,)
        if len(out) != self.n:
            raise PlanError(f"op {self.actor.op!r} returned {len(out)} tensors but actor "  # type: ignore
                            f"{self.actor.name!r} declares outputs={self.n}")
        return out

    def _into(self, out: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor]:
        if self.into is not None:
            self.into(inputs, self.attrs, out)
        else:  # a kernel that cannot write in place: its result is copied there
            res = self.kernel(inputs, self.attrs)
            out.copy_(res[0] if isinstance(res, (tuple, list)) else res)
        return (out,)


class FusedB(Behaviour):
    """Runs a ``Fused`` actor's parts back to back. ``marks``, when set (a traced run), gets ``clock()``
    before each part and after the last, for one trace event per part; ``at`` is the part running, and
    ``activity`` (the rank's activity slots, when the driver reads them) names it by its plan index
    (``origin``), so a rank that dies inside a part is reported in that part."""

    def __init__(self, actor: Fused, micro: int, steps: int, device: torch.device,
                 views: list[torch.Tensor] | None = None) -> None:
        super().__init__(actor, micro, steps, device)
        n = len(actor.parts)
        self.parts = [ComputeB(p, micro, steps, device, views if k == n - 1 else None)
                      for k, p in enumerate(actor.parts)]
        self.wiring = actor.wiring
        self.exposed = actor.exposed
        self.marks: list | None = None
        self.clock: Callable[[], Any] = time.perf_counter_ns
        self.at = 0
        self.activity: Any = None
        self.origin: list[int] = []

    def fire(self, k, inputs):
        got: list[tuple] = []
        marks, activity = self.marks, self.activity
        for n, (part, wires) in enumerate(zip(self.parts, self.wiring)):
            self.at = n
            if activity is not None:
                activity[0] = self.origin[n] + 1
            if marks is not None:
                marks.append(self.clock())
            got.append(part.fire(k, [inputs[j] if src < 0 else got[src][j] for src, j in wires]))
        if marks is not None:
            marks.append(self.clock())
        return tuple(got[n][j] for n, j in self.exposed) if self.exposed else got[-1]


class SourceB(Behaviour):
    def __init__(self, actor: Source, micro, steps, device, feed: list[torch.Tensor]) -> None:
        super().__init__(actor, micro, steps, device)
        want = steps * micro if actor.scope == "micro" else steps
        if len(feed) != want:
            raise PlanError(f"source {actor.name!r} got {len(feed)} shards of feed {actor.feed!r}, "
                            f"needs {want}")
        self.feed = feed

    def fire(self, k, inputs):
        return (self.feed[k].to(self.device, non_blocking=True),)


class SinkB(Behaviour):
    def __init__(self, actor: Sink, micro, steps, device) -> None:
        super().__init__(actor, micro, steps, device)
        self.values: list[torch.Tensor] = []

    def fire(self, k, inputs):
        self.values.append(inputs[0].detach().to("cpu", copy=True))
        return None


class StateB(Behaviour):
    """``value``: start from this tensor (the worker's kept final value of the previous run), not ``init``."""

    def __init__(self, actor: State, micro, steps, device, value: torch.Tensor | None = None) -> None:
        super().__init__(actor, micro, steps, device)
        self.value = materialize(actor.init, device) if value is None else value  # type: ignore[arg-type]

    def fire(self, k, inputs):
        if inputs:  # the update of step k - 1
            self.value = inputs[0]
        return (self.value,) if k < self.steps else None


class AccumulateB(Behaviour):
    def __init__(self, actor: Accumulate, micro, steps, device, views: list[torch.Tensor] | None = None) -> None:
        super().__init__(actor, micro, steps, device)
        self.buf: list[torch.Tensor] | None = None
        self.views = views  # ``into``: accumulate in the step's buffer of the pool, not a fresh one

    def fire(self, k, inputs):
        scale = self.actor.scale  # type: ignore[attr-defined]
        if k % self.micro == 0 and self.views is not None:
            buf = self.views[(k // self.micro) % len(self.views)]
            if scale == 1.0:
                buf.copy_(inputs[0])
            else:
                torch.mul(inputs[0], scale, out=buf)
            self.buf = [buf]
        elif k % self.micro == 0:
            self.buf = [x.clone() if scale == 1.0 else x * scale for x in inputs]
        else:
            for b, x in zip(self.buf, inputs):  # type: ignore[arg-type]
                b.add_(x, alpha=scale)
        if k % self.micro != self.micro - 1:
            return None
        out, self.buf = self.buf, None
        if self.actor.reduce == "mean":  # type: ignore[attr-defined]
            out = [b.div_(self.micro) for b in out]  # type: ignore[union-attr]
        return tuple(out)  # type: ignore[arg-type]


def make_behaviour(a: Actor, micro: int, steps: int, device: torch.device,
                   feeds: dict[str, list[torch.Tensor]], pools: BufferPools | None = None,
                   resume: dict[str, torch.Tensor] | None = None) -> Behaviour | None:
    """None for communication actors (the comm lane runs those); ``pools`` holds the buffers of actors
    that write ``into`` one; ``resume``: State name -> the value it starts from instead of its init."""
    into = getattr(a, "into", None)
    views = pools.views(into) if into is not None and pools is not None else None
    if isinstance(a, Compute):
        return ComputeB(a, micro, steps, device, views)
    if isinstance(a, Fused):
        return FusedB(a, micro, steps, device, views)
    if isinstance(a, Source):
        if a.feed not in feeds:
            raise PlanError(f"source {a.name!r} reads feed {a.feed!r}, which the batches do not have; "
                            f"feeds: {sorted(feeds)}")
        return SourceB(a, micro, steps, device, feeds[a.feed])
    if isinstance(a, Sink):
        return SinkB(a, micro, steps, device)
    if isinstance(a, State):
        return StateB(a, micro, steps, device, resume.get(a.name) if resume else None)
    if isinstance(a, Accumulate):
        return AccumulateB(a, micro, steps, device, views)
    return None
