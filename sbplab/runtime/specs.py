"""Actor specs: the typed records an ActorPlan is made of, one class per kind of actor.

A plan is the contract between the compiler and the runtime. Each rank gets a list of actors; an
actor fires when every input register it reads is ready and one of its own output registers is
free (OneFlow's rule). Register counts are the memory quota and the pipelining depth.

Firing counts are fixed by the actor's ``scope``, so the data flow is a static graph unrolled over
steps and micro-batches:

- ``"micro"`` actors fire once per micro-batch (``steps * micro_batches`` times per run);
- ``"step"`` actors fire once per step (``steps`` times): optimizer updates, parameter holders;
- an ``Accumulate`` actor fires per micro-batch but emits once per step (gradient accumulation).

A micro actor reading a step register reads the same value for every micro-batch of that step;
a step actor can only read micro registers through an ``Accumulate``.

Communication actors (``Collective``, ``Send``, ``Recv``) are issued in one global order of all
communication (``ActorPlan.comm_order``), which is what NCCL (and Gloo) need to never mismatch;
their ``order`` field only breaks ties when that order is derived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..boxing.kinds import collective_names, kind_of
from ..errors import SbplabError
from ..placement import Placement
from ..sbp import Broadcast, NdSbp, Partial, Split, as_nd_sbp, fmt_sbp
from .buffers import BufferSlot

PHASES = ("forward", "backward", "update")
SCOPES = ("micro", "step")
REDUCE_OPS = ("sum", "max", "min", "avg")
MICRO_REDUCE = ("mean", "sum", "stack", "last")


class PlanError(SbplabError, ValueError):
    """A plan that cannot run: the message names the rank, the actor and the broken invariant."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A register reference: output ``index`` of actor ``actor`` on the same rank."""

    actor: str
    index: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.actor, str) or not self.actor:
            raise PlanError(f"Ref.actor must be a non-empty actor name, got {self.actor!r}")
        if self.index < 0:
            raise PlanError(f"Ref({self.actor!r}).index must be >= 0, got {self.index}")

    def __repr__(self) -> str:
        return self.actor if self.index == 0 else f"{self.actor}[{self.index}]"


def _refs(xs: Sequence[Ref | str]) -> tuple[Ref, ...]:
    if type(xs) is tuple:  # lowering hands over tuples of Refs: keep them (a tuple is immutable)
        for x in xs:
            if type(x) is not Ref:
                break
        else:
            return xs  # type: ignore[return-value]
    return tuple(x if isinstance(x, Ref) else Ref(x) for x in xs)


_SBP_TYPES = (Split, Broadcast, Partial)


def _nd_sbp(sbp: Any, ndim: int) -> NdSbp:
    """``as_nd_sbp(sbp, ndim)``; a tuple of ``ndim`` SBPs (what lowering passes) is returned as is,
    exactly what ``as_nd_sbp`` returns for it, without its general parsing."""
    if type(sbp) is tuple and len(sbp) == ndim:
        for x in sbp:
            if not isinstance(x, _SBP_TYPES):
                break
        else:
            return sbp
    return as_nd_sbp(sbp, ndim)


@dataclass
class Actor:
    """Fields shared by every actor.

    name: unique on its rank; registers are addressed as ``Ref(name, index)``.
    inputs: registers this actor reads, in kernel argument order.
    registers: how many firings' outputs may be alive at once (>= 1); the memory quota and the
        pipelining depth. A firing waits until its oldest register is acked by every consumer.
    phase: forward, backward or update (for traces, pictures and memory accounting).
    scope: "micro" fires once per micro-batch, "step" once per step (see the module docstring).
    """

    name: str
    inputs: tuple[Ref, ...] = ()
    registers: int = 2
    phase: str = "forward"
    scope: str = "micro"

    lane: ClassVar[str] = "compute"  # compute lane (kernels) or comm lane (collectives, p2p)
    kind: ClassVar[str] = "actor"

    def __post_init__(self) -> None:
        self.inputs = _refs(self.inputs)
        if not isinstance(self.name, str) or not self.name:
            raise PlanError(f"an actor needs a non-empty name, got {self.name!r}")
        if self.registers < 1:
            raise PlanError(f"actor {self.name!r}: registers must be >= 1, got {self.registers}")
        if self.phase not in PHASES:
            raise PlanError(f"actor {self.name!r}: phase must be one of {PHASES}, got {self.phase!r}")
        if self.scope not in SCOPES:
            raise PlanError(f"actor {self.name!r}: scope must be one of {SCOPES}, got {self.scope!r}")

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def out_scope(self) -> str:
        """How often outputs are produced; differs from ``scope`` only for Accumulate."""
        return self.scope

    @property
    def label(self) -> str:
        """What ran, for traces and errors: the op or the collective."""
        return self.kind


@dataclass
class Compute(Actor):
    """Runs a kernel on local tensors.

    op: a registry op name (``sbplab.ops.get_op(op).kernel`` is called) or ``"module:function"``
        for a plain kernel ``f(inputs: list[Tensor], attrs: dict) -> Sequence[Tensor]``.
    attrs: LOCAL attributes, already adapted to this rank's shard by the compiler.
    outputs: number of output tensors the kernel returns.
    into: the kernel writes its one output into this slot of a shared buffer (``buffers.py``) instead
        of a tensor of its own: a gradient written straight into its bucket.
    """

    op: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    into: BufferSlot | None = None
    kind: ClassVar[str] = "compute"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.op:
            raise PlanError(f"compute actor {self.name!r} needs an op name")
        self.attrs = dict(self.attrs or {})
        if self.outputs < 0:
            raise PlanError(f"compute actor {self.name!r}: outputs must be >= 0, got {self.outputs}")
        _check_into(self, self.outputs)

    @property
    def num_outputs(self) -> int:
        return self.outputs

    @property
    def label(self) -> str:
        return self.op


@dataclass
class Collective(Actor):
    """One collective over ``group`` (global ranks, in mesh-axis order) on one input tensor.

    kind_: the name of a collective boxing kind (``sbplab.boxing.kinds``): all_reduce | all_gather |
        reduce_scatter | all_to_all | broadcast; the kind runs it.
    reduce_op: sum | max | min | avg (all_reduce, reduce_scatter).
    dim: the gathered / scattered tensor dim (all_gather, reduce_scatter); for all_to_all the dim
        that is split and sent out (``S(cat_dim) -> S(dim)``).
    cat_dim: all_to_all only: the dim along which received pieces are concatenated.
    sizes: per group member, its piece's size along ``dim`` (balanced splits are uneven);
        None means equal pieces.
    cat_sizes: all_to_all only: per group member, its input's size along ``cat_dim``.
    chunks: all_gather / reduce_scatter of a strided split ``S(dim, chunks=k)``: each piece is its slice
        of k chunks, reordered around the collective (1: a contiguous split).
    src: broadcast only: the global rank that holds the value.
    order: priority among communication that is ready at the same moment when the global order
        is derived (lower first); the global order itself is ``ActorPlan.comm_order``.
    mesh_axis: the mesh axis the group runs on (set by lowering; None in hand-built plans).
    bytes_sent: the bytes this rank really sends, from the kind, the number its plan step reports
        and its trace events log (set by lowering; None in hand-built plans, where the kind counts
        them from the input when it runs).
    """

    kind_: str = "all_reduce"
    group: tuple[int, ...] = ()
    reduce_op: str = "sum"
    dim: int = 0
    cat_dim: int = 0
    sizes: tuple[int, ...] | None = None
    cat_sizes: tuple[int, ...] | None = None
    chunks: int = 1
    src: int = 0
    order: int = 0
    mesh_axis: int | None = None
    bytes_sent: int | None = None
    lane: ClassVar[str] = "comm"
    kind: ClassVar[str] = "collective"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.group = tuple(int(r) for r in self.group)
        if self.kind_ not in collective_names():
            raise PlanError(f"collective {self.name!r}: kind_ must be one of {collective_names()}, "
                            f"got {self.kind_!r}")
        if self.mesh_axis is not None and self.mesh_axis < 0:
            raise PlanError(f"collective {self.name!r}: mesh_axis must be >= 0 or None, got {self.mesh_axis}")
        if self.bytes_sent is not None and self.bytes_sent < 0:
            raise PlanError(f"collective {self.name!r}: bytes_sent must be >= 0 or None, got {self.bytes_sent}")
        if len(self.group) < 1 or len(set(self.group)) != len(self.group):
            raise PlanError(f"collective {self.name!r}: group must list distinct ranks, got {self.group}")
        if self.reduce_op not in REDUCE_OPS:
            raise PlanError(f"collective {self.name!r}: reduce_op must be one of {REDUCE_OPS}")
        if len(self.inputs) != 1:
            raise PlanError(f"collective {self.name!r} reads exactly one register, got {len(self.inputs)}")
        for what, s in (("sizes", self.sizes), ("cat_sizes", self.cat_sizes)):
            if s is not None and len(s) != len(self.group):
                raise PlanError(f"collective {self.name!r}: {what} needs one entry per group member "
                                f"({len(self.group)}), got {tuple(s)}")
        if self.sizes is not None:
            self.sizes = tuple(int(x) for x in self.sizes)
        if self.cat_sizes is not None:
            self.cat_sizes = tuple(int(x) for x in self.cat_sizes)
        if kind_of(self.kind_).has_root and self.src not in self.group:
            raise PlanError(f"collective {self.name!r}: {self.kind_} src {self.src} is not in group "
                            f"{self.group}")

    @property
    def label(self) -> str:
        return self.kind_


@dataclass
class Send(Actor):
    """Sends its one input to global rank ``peer``; the matching Recv there has the same tag.

    order: as for Collective.
    """

    peer: int = -1
    tag: int = 0
    order: int = 0
    lane: ClassVar[str] = "comm"
    kind: ClassVar[str] = "send"

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.inputs) != 1:
            raise PlanError(f"send {self.name!r} reads exactly one register, got {len(self.inputs)}")
        if self.peer < 0:
            raise PlanError(f"send {self.name!r} needs its peer rank (peer >= 0)")

    @property
    def num_outputs(self) -> int:
        return 0


@dataclass
class Recv(Actor):
    """Receives one tensor of ``shape``/``dtype`` from global rank ``peer`` (see Send)."""

    peer: int = -1
    tag: int = 0
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    order: int = 0
    lane: ClassVar[str] = "comm"
    kind: ClassVar[str] = "recv"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.shape = tuple(int(s) for s in self.shape)
        if self.inputs:
            raise PlanError(f"recv {self.name!r} has no input registers, got {self.inputs}")
        if self.peer < 0:
            raise PlanError(f"recv {self.name!r} needs its peer rank (peer >= 0)")


@dataclass
class Source(Actor):
    """Feeds this rank's shard of one batch tensor, one micro-batch (or step) per firing.

    feed: the key of the tensor in each batch given to ``run``.
    placement, sbp: how the (micro-)batch tensor is laid out; the driver cuts the shards.
    micro_dim: the tensor dim cut into micro-batches (balanced, in order).
    """

    feed: str = ""
    placement: Placement | None = None
    sbp: NdSbp = ()
    micro_dim: int = 0
    kind: ClassVar[str] = "source"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.inputs:
            raise PlanError(f"source {self.name!r} has no input registers")
        if not self.feed or self.placement is None:
            raise PlanError(f"source {self.name!r} needs a feed name and a placement")
        self.sbp = _nd_sbp(self.sbp, self.placement.ndim)


@dataclass
class Sink(Actor):
    """Hands its one input back to the driver under ``key`` (losses, outputs).

    placement, sbp: layout of the value, so the driver can assemble the global value.
    micro_reduce: how the driver combines micro-batches of one step: mean | sum | stack | last.
    """

    key: str = ""
    placement: Placement | None = None
    sbp: NdSbp = ()
    micro_reduce: str = "mean"
    kind: ClassVar[str] = "sink"

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.inputs) != 1:
            raise PlanError(f"sink {self.name!r} reads exactly one register, got {len(self.inputs)}")
        if not self.key or self.placement is None:
            raise PlanError(f"sink {self.name!r} needs a key and a placement")
        if self.micro_reduce not in MICRO_REDUCE:
            raise PlanError(f"sink {self.name!r}: micro_reduce must be one of {MICRO_REDUCE}")
        self.sbp = _nd_sbp(self.sbp, self.placement.ndim)

    @property
    def num_outputs(self) -> int:
        return 0


@dataclass(frozen=True)
class Zeros:
    """A zero tensor described, not allocated. Optimizer states start as zeros; making them at
    compile time (and shipping them to every rank) would cost gigabytes for a large model, so the
    plan says "zeros of this shape" and the worker makes them where they live."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def materialize(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype, device=device)


def materialize(init: torch.Tensor | Zeros, device: torch.device | str = "cpu") -> torch.Tensor:
    """A State's initial value as a tensor of its own on ``device``."""
    return init.materialize(device) if isinstance(init, Zeros) else init.to(device, copy=True)


@dataclass
class State(Actor):
    """A tensor that persists across steps: a parameter or an optimizer state (scope "step").

    Firing k emits the value for step k. ``update`` names the register holding the next value:
    firing k + 1 consumes the update of step k (a one-step lag closes the cycle), and after the
    last step the final update is absorbed so the driver can read the final value.
    init: this rank's local shard at the start of every run (``Zeros`` for a zero start).
    key, placement, sbp: how the driver assembles the global value (``result.params[key]``).
    """

    init: torch.Tensor | Zeros | None = None
    update: Ref | None = None
    key: str = ""
    placement: Placement | None = None
    sbp: NdSbp = ()
    kind: ClassVar[str] = "state"

    def __post_init__(self) -> None:
        self.scope = "step"
        super().__post_init__()
        if isinstance(self.update, str):
            self.update = Ref(self.update)
        if self.inputs:
            raise PlanError(f"state {self.name!r} has no regular inputs; its next value comes via update=")
        if not isinstance(self.init, (torch.Tensor, Zeros)):
            raise PlanError(f"state {self.name!r} needs its initial local tensor (init=)")
        if self.placement is not None:
            self.sbp = _nd_sbp(self.sbp, self.placement.ndim)


@dataclass
class Accumulate(Actor):
    """Sums (or averages) each input over the micro-batches of a step; emits once per step.

    scale: a factor applied on the way in (OneFlow's acc with a scale, e.g. 1/M for a mean loss),
        so scaling and summing cost one pass over the data per micro-batch.
    into: accumulate in this slot of a shared buffer (``buffers.py``) instead of a buffer of its own
        (one input only): gradients accumulated straight into their bucket.
    """

    reduce: str = "sum"
    scale: float = 1.0
    into: BufferSlot | None = None
    kind: ClassVar[str] = "accumulate"

    def __post_init__(self) -> None:
        self.scope = "micro"
        super().__post_init__()
        if self.reduce not in ("sum", "mean"):
            raise PlanError(f"accumulate {self.name!r}: reduce must be sum or mean, got {self.reduce!r}")
        if not self.inputs:
            raise PlanError(f"accumulate {self.name!r} needs at least one input")
        _check_into(self, len(self.inputs))

    @property
    def num_outputs(self) -> int:
        return len(self.inputs)

    @property
    def out_scope(self) -> str:
        return "step"

    @property
    def label(self) -> str:
        return f"accumulate_{self.reduce}"


COMM_KINDS = (Collective, Send, Recv)


def _check_into(a: Actor, outputs: int) -> None:
    into = a.into  # type: ignore[attr-defined]
    if into is None:
        return
    if not isinstance(into, BufferSlot):
        raise PlanError(f"actor {a.name!r}: into must be a BufferSlot, got {into!r}")
    if outputs != 1:
        raise PlanError(f"actor {a.name!r} writes into {into.pool!r}'s buffer, so it must have exactly one "
                        f"output, got {outputs}")


def describe(a: Actor) -> str:
    """One line per actor for plan dumps and error messages."""
    ins = ", ".join(map(repr, a.inputs))
    extra = ""
    if isinstance(a, Collective):
        extra = f" group={a.group} order={a.order}"
    elif isinstance(a, (Send, Recv)):
        extra = f" peer={a.peer} tag={a.tag} order={a.order}"
    elif isinstance(a, (Source, Sink, State)) and a.placement is not None:
        extra = f" {fmt_sbp(a.sbp)}"
    return f"{a.name} = {a.label}({ins}) [{a.phase}, {a.scope}, regs={a.registers}]{extra}"
