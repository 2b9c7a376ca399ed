"""The firing rule of one rank's actors, as counters: shared by the runtime and the schedule simulator.

Each actor fires ``total`` times per run, in order. Firing ``k`` may start when

- for every input register (producer p, output j), p has produced the output that firing k reads
  (same scope: output k; a micro consumer of a step register: output k // M; a State's update:
  output k - 1), and
- if firing k produces output o, fewer than ``registers`` outputs are alive: o < released + registers,
  where ``released`` counts the outputs every consumer has acked (acks arrive in order per consumer,
  so releases are in order too);
- if it writes output o into a shared buffer (``into``, see ``buffers.py``), the buffer's guard has
  released output o - registers of the guard, the last one that used the same buffer;
- in a pipeline, if it is a micro-batch forward or backward compute firing, every action before its
  own in the rank's schedule has finished (``pipeline_order.py``): the schedule, not the timing,
  orders a stage's compute.

Among the compute firings that may start, a rank's one compute lane takes the lowest ``priority``:
oldest step, then micro-batch, then the actor's ``order``, then its position. The executor, the
simulator and the derivation of the communication order all use this rule and this key.

Finishing a firing produces its output (in order, even if comm firings complete out of order) and
acks the registers it read. The counters never decrease, so whether an actor can fire only ever
goes from False to True until it fires: that monotonicity is why a fixed communication order that
worked once (in simulation) cannot deadlock under other timings.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .pipeline_order import RankSchedule
from .specs import Accumulate, Actor, PlanError, State


@dataclass(slots=True, eq=False)
class Node:
    """Counters of one actor during a run."""

    actor: Actor
    index: int
    total: int  # firings this run
    n_out: int  # outputs produced this run
    inputs: list[tuple[int, int, str]] = field(default_factory=list)  # (producer, out idx, mode)
    consumers: list[int] = field(default_factory=list)  # node indices reading any output (with repeats)
    needed_acks: int = 0  # acks that release one output
    started: int = 0
    done_upto: int = 0  # firings finished, contiguous
    done_extra: set[int] | frozenset[int] = frozenset()  # finished out of order; a set once there is one
    produced: int = 0
    released: int = 0
    acks: dict[int, int] = field(default_factory=dict)  # output number -> acks so far
    # the same facts, coded for ``can_fire`` (it runs several times per firing): (producer, mode code)
    # with SAME, PER_STEP, LAG; and how firing k maps to its output register (REG_*), out of ``regs``
    deps: list[tuple[Node, int]] = field(default_factory=list)
    reg: int = 0
    regs: int = 1
    guard: Node | None = None  # the actor whose released registers free the buffer this one writes into
    guarded: list[int] = field(default_factory=list)  # actors writing into buffers this one guards
    apos: list[int] | None = None  # pipeline: per micro-batch, the place of its action in the rank's schedule


SAME, PER_STEP, LAG = 0, 1, 2
MODES = {"same": SAME, "per_step": PER_STEP, "lag": LAG}
REG_NONE, REG_FIRING, REG_STEP, REG_STATE = 0, 1, 2, 3  # no output; register k; k // micro; k below steps


class FiringGraph:
    """Counters for every actor of one rank over ``steps`` steps of ``micro`` micro-batches."""

    def __init__(self, actors: list[Actor], micro: int, steps: int, schedule: RankSchedule | None = None) -> None:
        self.micro, self.steps = micro, steps
        self.names = names = {a.name: i for i, a in enumerate(actors)}
        self.nodes: list[Node] = []
        nodes = self.nodes
        out_scopes = [a.out_scope for a in actors]  # a property: read once per actor, not per reader
        for i, a in enumerate(actors):
            scope = a.scope
            total = steps * micro if scope == "micro" else steps
            n_out = steps if out_scopes[i] == "step" else total
            state = isinstance(a, State)
            if state and a.update is not None:
                total = steps + 1  # the last firing absorbs the final update
            node = Node(a, i, total, n_out if a.num_outputs else 0, regs=a.registers)
            node.reg = REG_NONE if node.n_out == 0 else REG_STEP if isinstance(a, Accumulate) else \
                REG_STATE if state else REG_FIRING
            nodes.append(node)
        for node in nodes:
            a = node.actor
            scope = a.scope
            inputs, deps = node.inputs, node.deps
            for ref in a.inputs:
                p = names[ref.actor]
                prod = nodes[p]
                if out_scopes[p] == scope:
                    inputs.append((p, ref.index, "same"))
                    deps.append((prod, SAME))
                    prod.needed_acks += 1
                else:
                    inputs.append((p, ref.index, "per_step"))
                    deps.append((prod, PER_STEP))
                    prod.needed_acks += micro
                prod.consumers.append(node.index)
            if isinstance(a, State) and a.update is not None:
                p = names[a.update.actor]
                prod = nodes[p]
                inputs.append((p, a.update.index, "lag"))
                deps.append((prod, LAG))
                prod.needed_acks += 1
                prod.consumers.append(node.index)
            into = getattr(a, "into", None)
            if into is not None:
                node.guard = nodes[names[into.pool]]
                node.guard.guarded.append(node.index)
        self.unfinished = sum(1 for n in nodes if n.done_upto < n.total)  # kept by ``finish``
        self.orders = [getattr(a, "order", 0) for a in actors]
        self._gate(schedule)

    def _gate(self, schedule: RankSchedule | None) -> None:
        """The pipeline rule's counters: ``left[p]`` firings of action p (over every step) still to
        finish, ``frontier`` the first action not finished; ``gated`` the nodes it holds back."""
        self.gated: list[int] = []
        self.frontier, self.left, self.n_actions = 0, [], 0
        if schedule is None or not schedule.actions:
            return
        where = schedule.position()
        L = self.n_actions = len(schedule.actions)
        count = [0] * L
        for node in self.nodes:
            key = schedule.action_key(node.actor)
            if key is None:
                continue
            pos = [where.get((key[0], key[1], m)) for m in range(self.micro)]
            if any(p is None for p in pos):
                missing = [m for m, p in enumerate(pos) if p is None]
                raise PlanError(f"actor {node.actor.name!r} is a {key[0]} of stage {key[1]}, but the {schedule.name} "
                                 f"schedule of its rank has no such action for micro-batch(es) {missing}")
            node.apos = pos  # type: ignore[assignment]
            self.gated.append(node.index)
            for p in pos:
                count[p] += 1  # type: ignore[index]
        self.left = count * self.steps
        self._advance()

    def _advance(self) -> bool:
        """Move the frontier past finished actions; True if it moved."""
        f, left = self.frontier, self.left
        while f < len(left) and left[f] == 0:
            f += 1
        moved = f != self.frontier
        self.frontier = f
        return moved

    def priority(self, i: int) -> tuple[int, int, int, int]:
        """The key a rank's compute lane takes its next firing by (lowest first) for actor i's next
        firing: its step, its micro-batch (-1 for a step actor), the actor's ``order``, its index."""
        node = self.nodes[i]
        k = node.started
        if node.actor.scope == "micro":
            return k // self.micro, k % self.micro, self.orders[i], i
        return k, -1, self.orders[i], i

    # --- what firing k reads and writes ----------------------------------------------------------
    def out_number(self, node: Node, k: int) -> int | None:
        """The output firing k produces, or None: k itself, but an Accumulate emits once per step (on its
        last micro-batch) and a State's extra last firing only absorbs the final update."""
        reg = node.reg
        if reg == REG_FIRING:
            return k
        if reg == REG_NONE:
            return None
        if reg == REG_STEP:  # Accumulate
            return k // self.micro if k % self.micro == self.micro - 1 else None
        return k if k < self.steps else None  # State

    def in_number(self, mode: str, k: int) -> int | None:
        if mode == "same":
            return k
        if mode == "per_step":
            return k // self.micro
        return k - 1 if k >= 1 else None  # lag

    def register_number(self, node: Node, k: int) -> int | None:
        """The output register firing k needs free (an Accumulate holds it for the whole step)."""
        if node.n_out == 0:
            return None
        if isinstance(node.actor, Accumulate):
            return k // self.micro
        return self.out_number(node, k)

    # --- the rule -----------------------------------------------------------------------------------
    def can_fire(self, i: int) -> bool:
        """The rule above for actor i's next firing (``in_number`` and ``register_number``, inlined)."""
        node = self.nodes[i]
        k = node.started
        if k >= node.total:
            return False
        ap = node.apos
        if ap is not None and (k // self.micro) * self.n_actions + ap[k % self.micro] > self.frontier:
            return False
        for prod, mode in node.deps:
            if mode == SAME:
                if prod.produced <= k:
                    return False
            elif mode == PER_STEP:
                if prod.produced <= k // self.micro:
                    return False
            elif k >= 1 and prod.produced <= k - 1:  # LAG
                return False
        reg = node.reg
        guard = node.guard
        if guard is not None and (k // self.micro if reg == REG_STEP else k) >= guard.released + guard.regs:
            return False
        if reg == REG_NONE or (reg == REG_STATE and k >= self.steps):
            return True
        o = k // self.micro if reg == REG_STEP else k
        return o < node.released + node.regs

    def waiting_for(self, i: int) -> str:
        """Why actor i cannot fire now (for deadlock and hang reports)."""
        node = self.nodes[i]
        k = node.started
        if k >= node.total:
            return "finished"
        ap = node.apos
        if ap is not None and (k // self.micro) * self.n_actions + ap[k % self.micro] > self.frontier:
            return f"its turn in the pipeline schedule (action #{self.frontier % self.n_actions} of the step runs first)"
        for p, j, mode in node.inputs:
            o = self.in_number(mode, k)
            if o is not None and self.nodes[p].produced <= o:
                return f"input {self.nodes[p].actor.name}[{j}] output #{o}"
        o = self.register_number(node, k)
        if o is not None and o >= node.released + node.actor.registers:
            return f"a free register (all {node.actor.registers} held by unacked outputs)"
        g = node.guard
        if g is not None and o is not None and o >= g.released + g.regs:
            return f"its shared buffer (output #{o - g.regs} of {g.actor.name} is not released yet)"
        return "ready"

    def start(self, i: int) -> int:
        node = self.nodes[i]
        node.started += 1
        return node.started - 1

    def finish(self, i: int, k: int) -> list[int]:
        """Record that firing k of actor i finished; returns the actors whose state changed."""
        node = self.nodes[i]
        touched: list[int] = [i]
        micro = self.micro
        extra = node.done_extra
        if k != node.done_upto or extra:  # out of order: held until the firings before it finish
            if not isinstance(extra, set):
                extra = node.done_extra = set()
            extra.add(k)
        while node.done_upto == k or node.done_upto in extra:
            kk = node.done_upto
            if extra:
                extra.discard(kk)  # type: ignore[union-attr]
            node.done_upto += 1
            if node.done_upto == node.total:
                self.unfinished -= 1
            if node.apos is not None:  # one firing of its action done: the schedule may move on
                p = (kk // micro) * self.n_actions + node.apos[kk % micro]
                self.left[p] -= 1
                if self._advance():
                    touched.extend(self.gated)
            reg = node.reg  # ``out_number``, inlined
            if reg == REG_FIRING:
                o: int | None = kk
            elif reg == REG_NONE:
                o = None
            elif reg == REG_STEP:
                o = kk // micro if kk % micro == micro - 1 else None
            else:
                o = kk if kk < self.steps else None
            if o is not None:
                node.produced = o + 1
                if node.needed_acks == 0:
                    node.released = node.produced
                    touched.extend(node.guarded)
                touched.extend(node.consumers)
            for prod, mode in node.deps:  # ack what firing kk read (``in_number``, inlined)
                if mode == SAME:
                    oi = kk
                elif mode == PER_STEP:
                    oi = kk // micro
                elif kk >= 1:
                    oi = kk - 1
                else:
                    continue
                acks = prod.acks
                acks[oi] = acks.get(oi, 0) + 1
                while acks.get(prod.released, 0) >= prod.needed_acks and prod.released < prod.produced:
                    del acks[prod.released]
                    prod.released += 1
                    touched.append(prod.index)
                    if prod.guarded:
                        touched.extend(prod.guarded)
        return touched

    def finished(self) -> bool:
        return self.unfinished == 0

    def unlink(self) -> None:
        """Drop the references between nodes (``deps``) once the graph is done with.

        A State reads its update and the update reads the State, so the nodes form reference cycles
        and a finished graph (tens of thousands of nodes, their lists and tuples) would wait for the
        cyclic collector, which walks all of it. Unlinked, reference counting frees it at once.
        """
        for node in self.nodes:
            node.deps = []

    def micro_of(self, node: Node, k: int) -> int:
        """The micro-batch (within its step) of firing k; step-scope firings report -1."""
        return k % self.micro if node.actor.scope == "micro" else -1

    def step_of(self, node: Node, k: int) -> int:
        return k // self.micro if node.actor.scope == "micro" else k


class ReadyQueue:
    """A rank's compute lane's choice: the compute firings whose actors may fire now, taken lowest
    ``FiringGraph.priority`` first. The executor, the simulator and the communication-order derivation
    each keep one per rank, ``offer`` every actor whose counters changed and ``take`` when the lane is
    free, so all three pick the same way."""

    __slots__ = ("can_fire", "priority", "heap", "queued", "compute")

    def __init__(self, graph: FiringGraph) -> None:
        self.can_fire, self.priority = graph.can_fire, graph.priority
        self.heap: list[tuple[int, int, int, int]] = []
        self.queued = [False] * len(graph.nodes)
        self.compute = [n.actor.lane != "comm" for n in graph.nodes]

    def offer(self, i: int) -> None:
        """Queue actor i's next firing if it is compute and may fire (its priority holds until it starts)."""
        if self.compute[i] and not self.queued[i] and self.can_fire(i):
            self.queued[i] = True
            heapq.heappush(self.heap, self.priority(i))

    def take(self) -> int:
        """The actor whose firing the lane runs next (the caller starts it)."""
        i = heapq.heappop(self.heap)[-1]
        self.queued[i] = False
        return i

    def __bool__(self) -> bool:
        return bool(self.heap)
