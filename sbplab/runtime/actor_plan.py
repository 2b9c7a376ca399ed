"""ActorPlan: the per-rank actors of a parallel training step and the one order of all communication.

The compiler lowers a physical graph to this; hand-built plans (tests, tutorials) use it directly.
Actor kinds live in ``specs.py``; the firing rule in ``firing.py``.

Matching across ranks is by name: a collective is the actor of that name on every member of its
group (same kind, group and sizes everywhere); a send matches the receive on its peer with the
same tag.

``comm_order`` is one step's communication, globally ordered: ``CommSlot(rank, actor, micro)``
entries, ``micro`` being the micro-batch within the step (-1 for a step-scope actor). Each rank
issues its own slots in this order every step. Every channel (a collective group, or a pair of
ranks for send/recv) then sees the same sequence on all its members, which is what NCCL needs.
If a plan has no ``comm_order`` the runtime derives one by simulating the actors
(``schedule.derive_comm_order``), which also proves the register counts cannot deadlock; a given
order is replayed the same way (``schedule.check_comm_order``) and refused if it would deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..gc_pause import gc_paused
from .pipeline_order import RankSchedule
from .specs import Actor, Collective, PlanError, Recv, Send, describe

_MATCH_FIELDS = ("kind_", "group", "reduce_op", "dim", "cat_dim", "sizes", "cat_sizes", "src", "scope")


@dataclass(frozen=True, order=True)
class CommSlot:
    """One communication firing in the global order: ``actor`` on ``rank`` for micro-batch ``micro``."""

    rank: int
    actor: str
    micro: int = -1


def channel_of(rank: int, a: Actor) -> tuple:
    """Which communicator an actor uses: its group for collectives, the rank pair for send/recv."""
    if isinstance(a, Collective):
        return ("group",) + a.group
    peer = a.peer  # type: ignore[attr-defined]
    return ("pair", min(rank, peer), max(rank, peer))


def match_key(rank: int, a: Actor, micro: int) -> tuple:
    """The same value on every rank taking part in one communication."""
    if isinstance(a, Collective):
        return ("coll", a.name, micro)
    if isinstance(a, Send):
        return ("p2p", rank, a.peer, a.tag, micro)
    return ("p2p", a.peer, rank, a.tag, micro)  # Recv


@dataclass
class RankPlan:
    """The actors of one rank, in any order (declaration order breaks ties when several are ready);
    in a pipeline, ``schedule`` orders its micro-batch compute (``pipeline_order.py``)."""

    rank: int
    actors: list[Actor] = field(default_factory=list)
    schedule: RankSchedule | None = None

    def __post_init__(self) -> None:
        self.actors = list(self.actors)
        self._comm: list[int] | None = None
        self.by_name: dict[str, Actor] = {}
        for a in self.actors:
            if not isinstance(a, Actor):
                raise PlanError(f"rank {self.rank}: {a!r} is not an actor spec")
            if a.name in self.by_name:
                raise PlanError(f"rank {self.rank}: two actors are named {a.name!r}")
            self.by_name[a.name] = a
        by_name = self.by_name
        for a in self.actors:
            upd = getattr(a, "update", None)
            for ref in a.inputs if upd is None else (*a.inputs, upd):
                p = by_name.get(ref.actor)
                if p is None:
                    raise PlanError(f"rank {self.rank}: actor {a.name!r} reads {ref.actor!r}, which no actor "
                                    f"on this rank is named; actors here: {sorted(self.by_name)}")
                if ref.index >= p.num_outputs:
                    raise PlanError(f"rank {self.rank}: actor {a.name!r} reads output {ref.index} of "
                                    f"{p.name!r}, which has {p.num_outputs} outputs")
                if a.scope == "step" and p.out_scope == "micro":
                    raise PlanError(f"rank {self.rank}: step actor {a.name!r} reads micro-batch register "
                                    f"{ref!r}; put an Accumulate between them")
            if upd is not None and by_name[upd.actor].out_scope != "step":
                raise PlanError(f"rank {self.rank}: state {a.name!r} is updated by {upd!r}, which is "
                                f"produced per micro-batch; updates must be step-scope")
            into = getattr(a, "into", None)
            if into is not None:
                guard = by_name.get(into.pool)
                if guard is None or guard.num_outputs == 0 or guard.out_scope != a.out_scope:
                    raise PlanError(f"rank {self.rank}: actor {a.name!r} writes into the buffers of "
                                    f"{into.pool!r}, which must be an actor on this rank with outputs of the "
                                    f"same scope ({a.out_scope})")

    @classmethod
    def like(cls, rep: RankPlan, rank: int, actors: list[Actor], schedule: RankSchedule | None) -> RankPlan:
        """Rank ``rank``'s plan, whose actors lowering made alike to ``rep``'s position by position (same
        types, wiring by position, scopes, outputs: ``ActorPlan.alike``): ``rep``'s checks hold for it, so
        only its names are checked (unique, as ``rep``'s)."""
        rp = cls.__new__(cls)
        rp.rank, rp.actors, rp.schedule = rank, list(actors), schedule
        rp.by_name = {a.name: a for a in rp.actors}
        if len(rp.by_name) != len(rp.actors) or len(rp.actors) != len(rep.actors):
            return cls(rank, actors, schedule)  # not what ``alike`` promised: the full checks say why
        rp._comm = rep.comm_positions
        return rp

    @property
    def comm_positions(self) -> list[int]:
        """Positions of the communication actors (collectives, sends, receives), in order."""
        if self._comm is None:
            self._comm = [i for i, a in enumerate(self.actors) if a.lane == "comm"]
        return self._comm

    @property
    def comm_actors(self) -> list[Actor]:
        actors = self.actors
        return [actors[i] for i in self.comm_positions]

    def comm_items(self) -> list[tuple[int, Actor]]:
        """(position, actor) of each communication actor, in order."""
        actors = self.actors
        return [(i, actors[i]) for i in self.comm_positions]

    @property
    def n_actors(self) -> int:
        return len(self.actors)

    def actor_at(self, i: int) -> Actor:
        """The actor at position i (a lazily made rank makes only what it must: ``LazyRankPlan``)."""
        return self.actors[i]

    def comm_named(self, name: str) -> Actor | None:
        """The communication actor called ``name`` on this rank, or None."""
        a = self.by_name.get(name)
        return a if a is not None and a.lane == "comm" else None

    def dump(self) -> str:
        return "\n".join([f"rank {self.rank}:"] + ["  " + describe(a) for a in self.actors])


def _plain_rank(rank: int, actors: list[Actor], schedule: RankSchedule | None) -> RankPlan:
    """A RankPlan of actors already checked (a ``LazyRankPlan`` made whole, unpickled)."""
    rp = RankPlan.__new__(RankPlan)
    rp.rank, rp.actors, rp.schedule, rp._comm = rank, actors, schedule, None
    rp.by_name = {a.name: a for a in actors}
    return rp


class LazyRankPlan(RankPlan):
    """A rank the lowering made alike to a representative (``ActorPlan.alike``) whose plain kernels are made
    when first asked: its communication, sources, states and buffers are made with the plan, the other
    positions hold None until ``actors`` (or ``by_name``, or a position that is None) is read, which calls
    ``fill`` once to make them in place.

    Why: at 64 ranks of a GPT, copying the representative's kernels under every member's names was most
    of lowering, though the plan's checks, its communication order and the simulator read a member's
    communication and sources only (the simulator prices and fires one rank per class). A real run pickles
    each rank's plan for its worker, which makes the rank whole on the driver first (``__reduce__``); a
    picture or a trace asks for ``actors`` and gets them made.
    """

    def __init__(self, rank: int, actors: list, schedule: RankSchedule | None = None) -> None:
        self.rank, self.schedule, self._fill, self._names = rank, schedule, None, None
        self.actors = list(actors)  # made whole: the checks of an ordinary RankPlan
        RankPlan.__post_init__(self)

    @classmethod
    def member(cls, rep: RankPlan, rank: int, slots: list, schedule: RankSchedule | None,
               fill: Callable[[list], None]) -> LazyRankPlan:
        """Rank ``rank``'s plan of ``slots`` (None where ``fill`` makes the actor), alike to ``rep``'s by position."""
        rp = cls.__new__(cls)
        rp.rank, rp.schedule, rp._slots, rp._fill, rp._names = rank, schedule, slots, fill, None
        rp._by_name = None
        rp._comm = rep.comm_positions
        return rp

    def _whole(self) -> list:
        fill = self._fill
        if fill is not None:
            self._fill = None
            fill(self._slots)
        return self._slots

    @property  # type: ignore[override]
    def actors(self) -> list:
        return self._whole()

    @actors.setter
    def actors(self, value: list) -> None:
        self._slots, self._fill, self._by_name = value, None, None

    @property  # type: ignore[override]
    def by_name(self) -> dict[str, Actor]:
        if self._by_name is None:
            self._by_name = {a.name: a for a in self._whole()}
        return self._by_name

    @by_name.setter
    def by_name(self, value: dict[str, Actor]) -> None:
        self._by_name = value

    @property
    def n_actors(self) -> int:
        return len(self._slots)

    def actor_at(self, i: int) -> Actor:
        a = self._slots[i]
        return a if a is not None else self._whole()[i]

    @property
    def comm_actors(self) -> list[Actor]:
        slots = self._slots
        return [slots[i] for i in self.comm_positions]

    def comm_items(self) -> list[tuple[int, Actor]]:
        slots = self._slots
        return [(i, slots[i]) for i in self.comm_positions]

    def comm_named(self, name: str) -> Actor | None:
        if self._names is None:
            self._names = {a.name: a for a in self.comm_actors}
        return self._names.get(name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankPlan):
            return NotImplemented
        return (self.rank, self.actors, self.schedule) == (other.rank, other.actors, other.schedule)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return _plain_rank, (self.rank, self.actors, self.schedule)


@dataclass
class ActorPlan:
    """What every rank runs.

    world_size: number of ranks (global ranks 0..world_size-1); ranks without actors idle.
    ranks: per rank its RankPlan (a list of actors is accepted too).
    device_type: "cpu" (Gloo, threads) or "cuda" (NCCL, one GPU per rank, CUDA streams); None: any
        device (a step compiled device-free), bound by the cluster that runs it.
    micro_batches: micro-batches per step; micro actors fire this many times per step.
    comm_order: the global order of one step's communication (see module doc); None: derived.
    name: shown in traces and errors.
    imports: modules every worker imports before building actors (ones that register ops).
    alike: representative rank -> the ranks (itself first) whose actors lowering made from its own,
        position by position (``compiler/lowering/grouped.py``): the same types, ops, attributes (but a
        random op's stream and draw, and a plain kernel's ``where_attrs``: where its piece lies), wiring
        by position, registers, scopes, phases and shapes; names, a collective's group, order, root and
        bytes sent, a send's or receive's peer and tag, and a state's values may differ. Checks and
        passes that read only those look at one rank per group; None: no such knowledge.
    """

    world_size: int
    ranks: dict[int, RankPlan] = field(default_factory=dict)
    device_type: str | None = "cpu"
    micro_batches: int = 1
    comm_order: tuple[CommSlot, ...] | None = None
    name: str = "plan"
    imports: tuple[str, ...] = ()
    alike: dict[int, tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise PlanError(f"world_size must be >= 1, got {self.world_size}")
        if self.device_type not in ("cpu", "cuda", None):
            raise PlanError(f"device_type must be 'cpu', 'cuda' or None (any), got {self.device_type!r}")
        if self.micro_batches < 1:
            raise PlanError(f"micro_batches must be >= 1, got {self.micro_batches}")
        ranks: dict[int, RankPlan] = {}
        items = self.ranks.items() if isinstance(self.ranks, Mapping) else enumerate(self.ranks)
        for r, rp in items:
            if not 0 <= r < self.world_size:
                raise PlanError(f"rank {r} is outside 0..{self.world_size - 1}")
            ranks[r] = rp if isinstance(rp, RankPlan) else RankPlan(r, list(rp))
            if ranks[r].rank != r:
                raise PlanError(f"RankPlan for rank {ranks[r].rank} is filed under rank {r}")
        for r in range(self.world_size):
            ranks.setdefault(r, RankPlan(r, []))
        self.ranks = dict(sorted(ranks.items()))
        if self.alike is not None:
            self._check_alike()
        with gc_paused():  # the simulations below make many short-lived objects and no cycles
            self._check_matching()
            if self.comm_order is None:
                from .schedule import derive_comm_order

                self.comm_order = derive_comm_order(self)
            else:
                from .schedule import check_comm_order

                self.comm_order = tuple(self.comm_order)
                self._check_order()
                check_comm_order(self)

    # --- cross-rank checks ----------------------------------------------------------------------
    def _check_alike(self) -> None:
        seen: set[int] = set()
        for rep, members in self.alike.items():  # type: ignore[union-attr]
            if not members or members[0] != rep or any(m not in self.ranks or m in seen for m in members):
                raise PlanError(f"alike[{rep}] = {members!r}: each group lists existing ranks, its "
                                f"representative first, every rank in one group at most")
            if any(self.ranks[m].n_actors != self.ranks[rep].n_actors for m in members):
                raise PlanError(f"alike[{rep}]: its ranks have different numbers of actors")
            seen.update(members)

    def _check_matching(self) -> None:
        sends: dict[tuple, str] = {}
        recvs: dict[tuple, str] = {}
        matched: set[tuple[str, tuple[int, ...]]] = set()  # every member equal to the first one checked
        for r, rp in self.ranks.items():
            for a in rp.comm_actors:
                if isinstance(a, Collective):
                    if r not in a.group:
                        raise PlanError(f"rank {r}: collective {a.name!r} has group {a.group} without "
                                        f"rank {r}")
                    if (a.name, a.group) in matched:
                        continue
                    matched.add((a.name, a.group))
                    for m in a.group:
                        if m >= self.world_size:
                            raise PlanError(f"collective {a.name!r}: rank {m} >= world_size "
                                            f"{self.world_size}")
                        other = self.ranks[m].comm_named(a.name)
                        if not isinstance(other, Collective):
                            raise PlanError(f"collective {a.name!r} on rank {r} (group {a.group}) has no "
                                            f"collective of that name on rank {m}")
                        for f in _MATCH_FIELDS:
                            if getattr(a, f) != getattr(other, f):
                                raise PlanError(f"collective {a.name!r}: {f} is {getattr(a, f)!r} on rank "
                                                f"{r} but {getattr(other, f)!r} on rank {m}")
                else:
                    peer = a.peer  # type: ignore[attr-defined]
                    if peer >= self.world_size or peer == r:
                        raise PlanError(f"rank {r}: {a.kind} {a.name!r} has peer {peer}; valid peers are the "
                                        f"other ranks 0..{self.world_size - 1}")
                    key = (r, peer, a.tag) if isinstance(a, Send) else (peer, r, a.tag)  # type: ignore
                    book = sends if isinstance(a, Send) else recvs
                    if key in book:
                        raise PlanError(f"{a.kind}s {book[key]!r} and {a.name!r} both use src {key[0]} -> "
                                        f"dst {key[1]} tag {key[2]}; tags must be unique per pair")
                    book[key] = a.name
        for key in set(sends) ^ set(recvs):
            side = f"send {sends[key]!r}" if key in sends else f"recv {recvs[key]!r}"
            raise PlanError(f"{side} (src {key[0]} -> dst {key[1]}, tag {key[2]}) has no matching "
                            f"{'recv' if key in sends else 'send'}")
        for key in sends:
            s = self.ranks[key[0]].comm_named(sends[key])
            v = self.ranks[key[1]].comm_named(recvs[key])
            if s.scope != v.scope:
                raise PlanError(f"send {s.name!r} is {s.scope}-scope but its recv {v.name!r} is "
                                f"{v.scope}-scope")

    def expected_slots(self, r: int) -> list[tuple[str, int]]:
        out = []
        for a in self.ranks[r].comm_actors:
            micros = range(self.micro_batches) if a.scope == "micro" else [-1]
            out.extend((a.name, m) for m in micros)
        return out

    def _check_order(self) -> None:
        per_rank: dict[int, list[tuple[str, int]]] = {r: [] for r in self.ranks}
        seqs: dict[tuple, dict[int, list[tuple]]] = {}
        for slot in self.comm_order:  # type: ignore[union-attr]
            if slot.rank not in self.ranks or slot.actor not in self.ranks[slot.rank].by_name:
                raise PlanError(f"comm_order names {slot}, which is not an actor of rank {slot.rank}")
            a = self.ranks[slot.rank].by_name[slot.actor]
            if a.lane != "comm":
                raise PlanError(f"comm_order names {slot}, but {a.name!r} is a {a.kind} actor")
            per_rank[slot.rank].append((slot.actor, slot.micro))
            ch = channel_of(slot.rank, a)
            seqs.setdefault(ch, {}).setdefault(slot.rank, []).append(match_key(slot.rank, a, slot.micro))
        for r in self.ranks:
            want = sorted(self.expected_slots(r))
            if sorted(per_rank[r]) != want:
                missing = sorted(set(want) - set(per_rank[r]))
                extra = sorted(set(per_rank[r]) - set(want))
                raise PlanError(f"comm_order must list each comm firing of rank {r} once per step; "
                                f"missing {missing[:5]}, unexpected or repeated {extra[:5]}")
        for ch, by_rank in seqs.items():
            first = next(iter(by_rank.values()))
            for r, seq in by_rank.items():
                if seq != first:
                    raise PlanError(f"channel {ch}: rank {r} issues {seq[:6]} but another member issues "
                                    f"{first[:6]}; every member must issue the same sequence")

    # --- views -------------------------------------------------------------------------------------
    def rank_order(self, r: int) -> list[tuple[str, int]]:
        """Rank r's communication firings of one step, in issue order."""
        return [(s.actor, s.micro) for s in self.comm_order if s.rank == r]  # type: ignore[union-attr]

    def groups(self) -> list[tuple[int, ...]]:
        """Every collective group of the plan, in a canonical order (all ranks create them alike)."""
        gs = {a.group for rp in self.ranks.values() for a in rp.comm_actors if isinstance(a, Collective)}
        return sorted(gs, key=lambda g: (len(g), g))

    def pairs(self) -> list[tuple[int, int]]:
        ps = {tuple(sorted((r, a.peer))) for r, rp in self.ranks.items() for a in rp.comm_actors  # type: ignore
              if isinstance(a, (Send, Recv))}
        return sorted(ps)

    def dump(self) -> str:
        head = f"ActorPlan {self.name!r}: {self.world_size} ranks, {self.device_type or 'any device'}, " \
               f"{self.micro_batches} micro-batches"
        order = "comm order: " + ", ".join(
            f"{s.rank}:{s.actor}" + (f"@{s.micro}" if s.micro >= 0 else "")
            for s in self.comm_order or ())
        return "\n".join([head] + [rp.dump() for rp in self.ranks.values()] + [order])

    @staticmethod
    def build(world_size: int, actors: Mapping[int, Sequence[Actor | None]],
              schedules: Mapping[int, RankSchedule] | None = None,
              fill: Callable[[int, list], None] | None = None, **kw) -> ActorPlan:
        """``fill(r, slots)``: makes in place the actors of member rank r (of a group in ``alike``) left None
        in ``actors[r]``; such a rank is a ``LazyRankPlan`` that calls it when first asked for them."""
        schedules = schedules or {}
        rep_of = {m: rep for rep, ms in (kw.get("alike") or {}).items() for m in ms if m != rep}
        with gc_paused():
            ranks: dict[int, RankPlan] = {}
            for r, a in actors.items():
                rep = rep_of.get(r)
                if rep is None or rep not in ranks:
                    ranks[r] = RankPlan(r, list(a), schedules.get(r))
                elif fill is not None and len(a) == ranks[rep].n_actors:
                    ranks[r] = LazyRankPlan.member(ranks[rep], r, list(a), schedules.get(r),
                                                   lambda slots, r=r: fill(r, slots))
                else:
                    ranks[r] = RankPlan.like(ranks[rep], r, list(a), schedules.get(r))
            return ActorPlan(world_size, ranks, **kw)
