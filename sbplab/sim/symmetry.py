"""Ranks that behave alike, simulated once.

In a data x tensor x pipeline layout most ranks run the same actors on same-shaped shards: every
rank of a pipeline stage, say. Two ranks belong to one class when their actors match position by
position (kind, op, wiring, registers, scope, phase, cost, output bytes) and they issue their
communication in the same positions and micro-batches. Ranks of a class then fire at the same
moments: each posts a communication when its own counters allow, which happens at the same time
on all of them, and a communication starts once every member posted it. So the engine simulates
one representative per class and the prediction copies its firings to the others.

Alike must also hold for whom they talk to: two senders whose receives sit at different places in
the same receiver's order do not wait alike. So the classes are refined (as in colour refinement)
until, for every communication, ranks of a class meet partners of the same classes at the same
positions. Any difference (an uneven split, a different op, a different partner) puts ranks in
different classes, so this never changes a result, only how much work it takes: the 64 ranks of one
8x8 data x tensor mesh are one class.
"""

from __future__ import annotations

from ..runtime.actor_plan import ActorPlan
from ..runtime.specs import Collective, PlanError, Recv, Send, State
from .firing_cost import FiringCost
from .shapes import ActorShapes, nbytes


def _signature(plan: ActorPlan, r: int, costs: list[FiringCost], shapes: dict[str, ActorShapes],
               order: list[tuple[str, int]]) -> tuple:
    actors = plan.ranks[r].actors
    pos = {a.name: i for i, a in enumerate(actors)}
    rows = []
    for a, c in zip(actors, costs):
        upd = getattr(a, "update", None) if isinstance(a, State) else None
        rows.append((type(a).__name__, a.label, tuple((pos[x.actor], x.index) for x in a.inputs), a.registers,
                     a.scope, a.phase, a.num_outputs, c.seconds, c.busy_extra, c.nbytes,
                     tuple(nbytes(m) for m in shapes[a.name].outputs),
                     (pos[upd.actor], upd.index) if upd is not None else None,
                     len(a.group) if isinstance(a, Collective) else 0))
    return (tuple(rows), tuple((pos[name], m) for name, m in order))


def _partners(plan: ActorPlan, r: int, lookup: Lookup) -> list[tuple[tuple[int, int], ...]]:
    """Per communication actor of rank r: (rank, actor position) of every party, r itself included for a
    collective (the group's tuple, one object shared by its members), the peer for a send or receive."""
    out = []
    for a in plan.ranks[r].comm_actors:
        if isinstance(a, Collective):
            out.append(lookup.members(a))
        elif isinstance(a, (Send, Recv)):
            out.append(((a.peer, lookup.partner(r, a)),))
    return out


def _classes_at(parts: tuple[tuple[int, int], ...], cls: dict[int, int], seen: dict[int, tuple]) -> tuple:
    """(class, position) of each party, sorted; made once per tuple of parties (``seen``, by identity)."""
    got = seen.get(id(parts))
    if got is None:
        got = seen[id(parts)] = (parts, tuple(sorted([(cls[m], j) for m, j in parts])))
    return got[1]


def _ids(sigs: dict[int, tuple]) -> dict[int, int]:
    number: dict[tuple, int] = {}
    return {r: number.setdefault(sig, len(number)) for r, sig in sigs.items()}


def rank_classes(plan: ActorPlan, costs: dict[int, list[FiringCost]], shapes: dict[int, dict[str, ActorShapes]],
                 alike: dict[int, list[int]] | None = None,
                 orders: dict[int, list[tuple[str, int]]] | None = None) -> dict[int, list[int]]:
    """Representative (lowest) rank -> every rank of its class, ranks in order.

    ``alike`` (``alike.alike_ranks``): ranks known to share their signature, so it is made for the first of
    each group (the only ones ``shapes`` needs); None: every rank on its own. ``orders``: each rank's
    communication order (``alike.rank_orders``), else taken from the plan."""
    alike = alike if alike is not None else {r: [r] for r in plan.ranks}
    number: dict[tuple, int] = {}
    cls: dict[int, int] = {}
    for r, members in alike.items():  # a signature is hashed once per alike group, not once per rank
        s = _signature(plan, r, costs[r], shapes[r], orders[r] if orders is not None else plan.rank_order(r))
        c = number.setdefault(s, len(number))
        cls.update((m, c) for m in members)
    cls = {r: cls[r] for r in plan.ranks}
    lookup = Lookup(plan)
    partners = {r: _partners(plan, r, lookup) for r in plan.ranks}
    while True:  # refine by the classes and positions of the partners until nothing splits
        # A collective's parties are its whole group, r included: ranks of one class hold their k-th
        # communication at the same position, so with r's class in the key, the group's classes and
        # positions say exactly what its other members' do, and are sorted once per group, not per member
        # (64 ranks of ZeRO-3: 449 sorts a round instead of 28,736).
        seen: dict[int, tuple] = {}
        new = _ids({r: (cls[r], tuple([_classes_at(parts, cls, seen) for parts in partners[r]])) for r in plan.ranks})
        if len(set(new.values())) == len(set(cls.values())):
            break
        cls = new
    members: dict[int, list[int]] = {}
    for r in plan.ranks:
        members.setdefault(cls[r], []).append(r)
    return {ms[0]: ms for ms in members.values()}


class Lookup:
    """Actor positions by name, and send/recv partners, built per rank on first use."""

    def __init__(self, plan: ActorPlan) -> None:
        self.plan = plan
        self.names: dict[int, dict[str, int]] = {}
        self.p2p: dict[int, dict[tuple, int]] = {}
        self.groups: dict[tuple[str, tuple[int, ...]], tuple[tuple[int, int], ...]] = {}

    def members(self, a) -> tuple[tuple[int, int], ...]:
        """(rank, position of collective ``a`` there) for every member of its group, found once per group."""
        key = (a.name, a.group)
        got = self.groups.get(key)
        if got is None:
            got = self.groups[key] = tuple((m, self.index(m, a.name)) for m in a.group)
        return got

    def index(self, rank: int, name: str) -> int:
        if rank not in self.names:  # communication actors only: the ones asked for
            self.names[rank] = {a.name: i for i, a in self.plan.ranks[rank].comm_items()}
        return self.names[rank][name]

    def partner(self, rank: int, a) -> int:
        """Position of the receive matching send ``a`` (or the send matching receive ``a``) on its peer."""
        peer = a.peer
        if peer not in self.p2p:
            self.p2p[peer] = {(type(b), b.peer, b.tag): i for i, b in self.plan.ranks[peer].comm_items()
                              if isinstance(b, (Send, Recv))}
        want = Recv if isinstance(a, Send) else Send
        i = self.p2p[peer].get((want, rank, a.tag))
        if i is None:
            raise PlanError(f"rank {rank}: {a.kind} {a.name!r} has no partner on rank {peer} with tag {a.tag}")
        return i
