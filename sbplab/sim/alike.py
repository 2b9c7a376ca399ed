"""Ranks whose shapes and costs are the same, found before either is worked out.

Why: at 64-128 ranks, inferring every register's shape and pricing every firing on every rank was most
of a simulation, though a data x tensor layout has a handful of distinct ranks. Two ranks are *alike*
when their actors match position by position in everything shape inference (``shapes.py``), pricing
(``firing_cost.py``, the step's recomputation and a framework's optimizer traffic) and the symmetry
signature (``symmetry._signature``) read, except the names of actors and of the ranks they talk to:
kind, op, local attributes, wiring by position, registers, scope, phase, a source's local shard, a
state's shard, a receive's shape, a collective's fields and position in its group, and the link each
communication crosses (on a ``Machine`` the ranks a group spans set its speed). So the shapes and costs
of one rank of each alike group are those of every member, position by position; the simulator works
them out once per group. Any difference keeps ranks apart, so this changes how much work is done, never
a result. (The symmetry classes, ``symmetry.rank_classes``, also ask who talks to whom; being alike
only says that the rank's own work is the same.)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from ..boxing.kinds import kind_of
from ..hardware import Hardware
from ..machine import Machine
from ..ops.registry import TensorMeta
from ..runtime.actor_plan import ActorPlan
from ..runtime.specs import Accumulate, Collective, Compute, Recv, Send, Source, State
from .comm_time import CommInfo, _attr_bytes
from .shapes import _cost_attrs, _source_meta, hashable_attrs, kernel_of


def rank_orders(plan: ActorPlan) -> dict[int, list[tuple[str, int]]]:
    """Every rank's communication firings of one step in issue order (``plan.rank_order`` for all ranks in
    one pass over the global order)."""
    out: dict[int, list[tuple[str, int]]] = {r: [] for r in plan.ranks}
    for s in plan.comm_order or ():
        row = out.get(s.rank)
        if row is None:
            row = out[s.rank] = []
        row.append((s.actor, s.micro))
    return out


class _Links:
    """The link a communication crosses, as its price depends on it: on a ``Machine``, the (alpha, bytes/s)
    of the ranks it spans, quiet and busy; elsewhere the mesh axis and group size say it (None)."""

    def __init__(self, hw: Hardware) -> None:
        self.machine = hw if isinstance(hw, Machine) else None
        self.seen: dict[tuple, object] = {}

    def __call__(self, kind: str, axis: int | None, group: tuple[int, ...]) -> object:
        if self.machine is None or len(group) <= 1:
            return None
        key = (kind, axis, group)
        v = self.seen.get(key)
        if v is None:
            v = self.seen[key] = (self.machine.collective_alpha_beta(kind, axis, group),
                                  self.machine.collective_alpha_beta(kind, axis, group, True))
        return v


def _member(a: Collective, r: int, memo: dict) -> int:
    """Rank r's position in ``a``'s group where its output shape or bytes may depend on it, else -1: the plan
    names the bytes (the lowering sets them) and the kind gives every member the same output shape for an
    input no member count divides (so uneven balanced pieces would show), whatever its sizes say."""
    if a.bytes_sent is None:
        return a.group.index(r)
    p = len(a.group)
    key = ("member", a.kind_, a.dim, a.cat_dim, a.sizes, a.cat_sizes, a.chunks, p)
    depends = memo.get(key)
    if depends is None:
        probe = (p + 1,) * (max(a.dim, a.cat_dim) + 1)
        kind = kind_of(a.kind_)
        try:
            depends = len({tuple(kind.actor_output_shape(a, m, probe)) for m in range(p)}) > 1
        except Exception:  # noqa: BLE001 - a kind that cannot say for the probe: keep the position
            depends = True
        memo[key] = depends
    return a.group.index(r) if depends else -1


@functools.cache
def _where_attrs(op: str) -> tuple[str, ...]:
    try:
        return tuple(getattr(kernel_of(op), "where_attrs", ()))
    except (ImportError, AttributeError, KeyError, ValueError):
        return ()  # no such kernel: shape inference says so


def _compute_attrs(a: Compute, memo: dict) -> object:
    """A kernel's attributes as its shapes and cost see them: less those that only say where its piece lies
    (``where_attrs`` of a plain kernel, e.g. ``narrow_piece``'s start) and a random op's stream. ``memo``:
    by the identity of the values (ranks' copies of one op's attributes share them), alive while the plan is."""
    attrs = a.attrs
    ident = (a.op, tuple(attrs), tuple(map(id, attrs.values())))
    got = memo.get(ident)
    if got is None:
        got = memo[ident] = (_frozen_attrs(a), a.attrs)  # the attrs kept: their ids stay theirs
    return got[0]


def _frozen_attrs(a: Compute) -> object:
    attrs = _cost_attrs(a.attrs)
    where = _where_attrs(a.op) if ":" in a.op else ()
    if where and isinstance(attrs, dict):
        attrs = {k: v for k, v in attrs.items() if k not in where}
    return hashable_attrs(attrs)


def _own(a, r: int, micro: int, batch: Mapping[str, TensorMeta], known: Mapping[str, CommInfo], links: _Links,
         memo: dict) -> tuple:
    """What shapes and prices read of a communication actor or a source on rank r (rank-dependent)."""
    if isinstance(a, Collective):
        info = known.get(a.name)
        axis = a.mesh_axis if a.mesh_axis is not None else (info.mesh_axis if info is not None else 0)
        g = a.group
        src = (g.index(a.src) if a.src in g else -1) if kind_of(a.kind_).has_root else None  # others ignore it
        return (a.kind_, a.reduce_op, a.dim, a.cat_dim, a.sizes, a.cat_sizes, a.chunks, a.mesh_axis, len(g),
                _member(a, r, memo), src, _attr_bytes(a.bytes_sent, r), info, links(a.kind_, axis, g))
    if isinstance(a, Recv):
        return (links("send_recv", None, (r, a.peer)), a.shape, a.dtype)
    if isinstance(a, Send):
        return (links("send_recv", None, (r, a.peer)),)
    return (a.feed, _source_meta(a, r, micro, batch))  # a Source


_PER_RANK = (Collective, Send, Recv, Source)  # what ``_own`` reads, apart from the rest of a rank's key


def _rows(actors: list, r: int, redo: set[str], memo: dict) -> tuple[tuple, list[int], bool]:
    """Rank r's actors as shapes, prices and the symmetry signature see them, but what ``_own`` reads; the
    positions of those actors; whether some attributes could not be hashed (the rank is then kept alone).
    ``redo``: the names of its actors the backward recomputes."""
    pos = {a.name: i for i, a in enumerate(actors)}
    rows, special, alone = [], [], False
    for i, a in enumerate(actors):
        if isinstance(a, Compute):
            fa = _compute_attrs(a, memo)
            own: tuple | None = (a.op, a.outputs, fa if fa is not None else ("rank", r, i))  # unhashable: alone
            alone = alone or fa is None
        elif isinstance(a, _PER_RANK):
            own = None
            special.append(i)
        elif isinstance(a, State):
            init, upd = a.init, a.update
            own = (tuple(init.shape), init.dtype, (pos[upd.actor], upd.index) if upd is not None else None)  # type: ignore[union-attr]
        elif isinstance(a, Accumulate):
            own = (a.reduce, a.scale)
        else:
            own = ()
        rows.append((type(a), a.label, tuple([(pos[x.actor], x.index) for x in a.inputs]), a.registers,
                     a.scope, a.phase, a.num_outputs, a.name in redo, own))
    return tuple(rows), special, alone


def alike_ranks(plan: ActorPlan, micro: int, batch: Mapping[str, TensorMeta], known: Mapping[str, CommInfo],
                hw: Hardware, redo: frozenset = frozenset(),
                orders: Mapping[int, list[tuple[str, int]]] | None = None) -> dict[int, list[int]]:
    """Representative (lowest) rank -> every rank alike to it, ranks in order. ``redo``: the (rank, actor)
    pairs the step recomputes (``StepPricing.recomputed``); ``orders``: ``rank_orders(plan)``.

    A rank the lowering made alike to another (``plan.alike``) shares that rank's rows: only its
    communication, sources (``_own``), recomputed actors and communication order are read."""
    orders = rank_orders(plan) if orders is None else orders
    links, memo = _Links(hw), {}
    redone: dict[int, set[str]] = {r: set() for r in plan.ranks}
    for r, name in redo:
        redone.setdefault(r, set()).add(name)
    lowered = {m: rep for rep, ms in (plan.alike or {}).items() for m in ms}
    rows_of: dict[int, tuple[int, list[int], list[int]]] = {}  # rank -> its rows' id, ``_own`` positions, redone
    ids: dict[tuple, int] = {}  # rows -> a number (a rank's rows are hashed once, not once per member)
    groups: dict[tuple, list[int]] = {}
    for r in plan.ranks:
        rp = plan.ranks[r]
        at = rp.actor_at  # a member's kernels are read only where it is recomputed (``LazyRankPlan``)
        rep = lowered.get(r, r)
        got = rows_of.get(rep)
        mine = redone[r]
        if got is not None and len(mine) == len(got[2]) and all(at(i).name in mine for i in got[2]):
            rid, special = got[0], got[1]
        else:
            rows, special, alone = _rows(rp.actors, r, mine, memo)
            rid = ids.setdefault(rows, len(ids))
            if rep == r and not alone:
                rows_of[r] = (rid, special, [i for i, row in enumerate(rows) if row[7]])
        extra = tuple([_own(at(i), r, micro, batch, known, links, memo) for i in special])
        pos = {at(i).name: i for i in special}
        key = (rid, extra, tuple([(pos[name], m) for name, m in orders[r]]))
        groups.setdefault(key, []).append(r)
    return {ms[0]: ms for ms in groups.values()}


def renamed(rep_actors: list, actors: list, per_name: Mapping[str, object]) -> dict[str, object]:
    """``per_name`` (the representative's figures by actor name) under the names of an alike rank's actors."""
    return {a.name: per_name[b.name] for a, b in zip(actors, rep_actors)}
