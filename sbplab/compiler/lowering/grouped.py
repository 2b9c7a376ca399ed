"""Lowering once per group of alike ranks: a rank whose op instances match a rank already lowered,
position by position, gets copies of that rank's actors under its own names, and the plan records the
group (``ActorPlan.alike``) so the checks and passes after lowering look at one rank per group.

Why: at 128 ranks of a 7.5B GPT (1.8 M actors), making every actor, then checking every rank's wiring,
deriving the communication order's uniform rank and grouping alike ranks in the simulator each walked
every actor of every rank, though a data x tensor layout has a handful of distinct ranks.

Two ranks are alike here when their physical nodes match position by position in kind, op, tensor,
stage, phase, micro-batch scope, shapes, dtypes, wiring (inputs by their position on the rank), local
attributes (but a random op's stream and draw, ``RNG_ATTRS``), plan step and bucket place; and when the
actors the ordinary lowering made for what is not a plain kernel (collectives, buckets, local boxing
steps, states, accumulations, sends and receives) match field by field, but for their names, a
collective's group, order, root and bytes sent (a ring sends a scalar's bytes unevenly), a send's or
receive's peer and tag, a state's values and where a local step's piece lies (a kernel's
``where_attrs``, which the simulator ignores too: ``sim/alike.py``). A plain compute node (most of them)
is then the representative's actor with the member's name, attributes and inputs: exactly what
``_Lowering.node`` makes for it. The transfers' tags are numbered first, in the global order, as
node-by-node lowering numbers them. Anything that differs keeps a rank apart (it is lowered on its own
and may represent later ranks), so grouping changes the work, never the plan.

In Python a copy and its check cost about what lowering the node does; what grouping saves is the
passes after lowering, which now read one rank per group.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from ...boxing.kinds import kernel_ref
from ...ops.registry import RNG_ATTRS
from ...runtime.buffers import BufferSlot
from ...runtime.specs import Actor, Collective, Compute, Recv, Send, State
from .bucket_views import gradients_into_buckets

if TYPE_CHECKING:
    from ..physical.graph import PhysNode
    from .to_actors import _Lowering

_COLL_FIELDS = ("kind_", "reduce_op", "dim", "cat_dim", "sizes", "cat_sizes", "chunks", "mesh_axis", "registers",
                "scope", "phase")  # not the group, order, root or bytes sent: they may differ by rank
MAX_TRIES = 4  # representatives a rank is compared with before it is lowered on its own


@functools.cache
def _where_attrs(op: str) -> tuple[str, ...]:
    """The attributes of a plain kernel (``module:function``) that say only where its piece lies."""
    if ":" not in op:
        return ()
    mod, fn = op.split(":", 1)
    try:
        return tuple(getattr(getattr(importlib.import_module(mod), fn), "where_attrs", ()))
    except (ImportError, AttributeError):
        return ()


def _same_attrs(a: dict, b: dict, op: str = "") -> bool:
    """Equal but for a random op's stream and draw and, of a plain kernel, where its piece lies."""
    if a is b or a == b:
        return True
    skip = RNG_ATTRS + _where_attrs(op)
    if not any(k in a for k in skip):
        return False
    return {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


class _Rep:
    """A rank lowered the ordinary way: its nodes, where each node's actors start, its members."""

    def __init__(self, rank: int, nodes: list[PhysNode], starts: list[int]) -> None:
        self.rank, self.nodes, self.starts = rank, nodes, starts
        self.members: list[int] = [rank]
        self.misses: list[int] = []  # node positions where a rank differed from this one
        self.into: list[tuple[int, int, int]] = []  # (producer, pack, input) positions written into a bucket


class GroupedLowering:
    """Drives ``_Lowering`` rank by rank."""

    def __init__(self, lw: _Lowering) -> None:
        self.lw = lw
        phys = lw.phys
        self.nodes_of: dict[int, list[PhysNode]] = {r: [] for r in phys.ranks}
        self.local = [0] * len(phys.nodes)  # node id -> its position among its rank's nodes
        for n in phys.nodes:
            row = self.nodes_of[n.rank]
            self.local[n.id] = len(row)
            row.append(n)
        self.reps: list[_Rep] = []
        self.rep_of: dict[int, _Rep] = {}
        self.made_from: dict[int, _Rep] = {}  # member rank -> the representative its actors are made from
        self.into_of: dict[int, dict[int, BufferSlot]] = {}  # member rank -> position -> its kernel's bucket slot
        # (id of a collective's fields, id of a representative's actor) -> whether they agree: both live as long
        # as the lowering (``_Lowering.coll_attrs``, the representative's actors)
        self.fields_same: dict[tuple[int, int], bool] = {}

    # --- lowering -----------------------------------------------------------------------------------
    def run(self) -> None:
        lw = self.lw
        for n in lw.phys.nodes:  # transfers' tags, numbered in the global order as node-by-node lowering does
            if n.kind == "boxing" and n.op == "send":
                for dst, block in n.attrs["transfers"]:
                    lw.tag(lw._transfer_key(n, n.rank, dst, block))
            elif n.kind == "boxing" and n.op == "recv":
                for src, block in n.attrs["transfers"]:
                    if src != n.rank:
                        lw.tag(lw._transfer_key(n, src, n.rank, block))
        for r, nodes in self.nodes_of.items():
            rep = self._copy_from_some(r, nodes)
            if rep is not None:
                self.rep_of[r] = self.made_from[r] = rep
                rep.members.append(r)
                continue
            actors, starts = lw.actors[r], []
            for n in nodes:
                starts.append(len(actors))
                lw.node(n)
            starts.append(len(actors))
            rep = self.rep_of[r] = _Rep(r, nodes, starts)
            self.reps.append(rep)

    def _copy_from_some(self, r: int, nodes: list[PhysNode]) -> _Rep | None:
        """The representative rank r's actors were copied from, the largest groups tried first; a node where
        a rank differed from a representative is compared first next time, so most misses cost one node."""
        tried = 0
        for rep in sorted(self.reps, key=lambda x: -len(x.members)):
            if len(rep.nodes) != len(nodes) or not all(self._node_alike(rep.nodes[i], nodes[i]) for i in rep.misses):
                continue
            at = self._copy(rep, r, nodes)
            if at < 0:
                return rep
            rep.misses.append(at)
            self._undo(r)
            tried += 1
            if tried >= MAX_TRIES:
                break
        return None

    def _undo(self, r: int) -> None:
        """Forget rank r's actors made so far (what else lowering noted is by node, and made again alike)."""
        lw = self.lw
        lw.actors[r].clear()
        lw.stage_of[r].clear()
        for key in [k for k in lw.waiting if k[1] == r]:
            del lw.waiting[key]

    def _node_alike(self, rn: PhysNode, mn: PhysNode) -> bool:
        local = self.local
        step = rn.attrs.get("plan_step") if rn.kind == "boxing" else None
        if step is not None and mn.kind == "boxing" and mn.attrs.get("plan_step") is step:
            # One boxing step (a planned route may be shared by boxings: the tensor, phase and stage are
            # compared): its dtype is the tensor's, nothing accumulates, and the op names the step's kind (a
            # move's send or receive).
            if (rn.logical != mn.logical or rn.op != mn.op or rn.when != mn.when or rn.phase != mn.phase
                    or rn.stage != mn.stage or rn.out_shapes != mn.out_shapes or rn.in_shapes != mn.in_shapes
                    or (rn.collective is None) != (mn.collective is None) or len(rn.inputs) != len(mn.inputs)):
                return False
            for a, b in zip(rn.inputs, mn.inputs):
                if a.out != b.out or local[a.node] != local[b.node]:
                    return False
            return self._same_bucket_place(rn, mn)
        if (rn.kind != mn.kind or rn.op != mn.op or rn.logical != mn.logical or rn.when != mn.when
                or rn.stage != mn.stage or rn.phase != mn.phase or rn.accumulate != mn.accumulate
                or rn.out_shapes != mn.out_shapes or rn.in_shapes != mn.in_shapes
                or rn.out_dtypes != mn.out_dtypes or (rn.collective is None) != (mn.collective is None)):
            return False
        ri, mi = rn.inputs, mn.inputs
        if len(ri) != len(mi):
            return False
        for a, b in zip(ri, mi):
            if a.out != b.out or local[a.node] != local[b.node]:
                return False
        if rn.kind == "compute":
            return _same_attrs(rn.attrs, mn.attrs)
        if rn.kind == "boxing":
            if rn.attrs.get("plan_step") is not mn.attrs.get("plan_step"):
                return False
            return self._same_bucket_place(rn, mn)
        return True

    def _same_bucket_place(self, rn: PhysNode, mn: PhysNode) -> bool:
        """Both in no bucket, or at the same place of buckets of as many reductions."""
        bucket_of = self.lw.bucket_of
        rb, mb = bucket_of.get(rn.collective), bucket_of.get(mn.collective)  # type: ignore[arg-type]
        if (rb is None) != (mb is None):
            return False
        pos = self.lw.bucket_pos
        return rb is None or (len(rb.collectives) == len(mb.collectives)  # type: ignore[union-attr]
                              and pos[rn.collective] == pos[mn.collective])  # type: ignore[index]

    def _copy(self, rep: _Rep, r: int, nodes: list[PhysNode]) -> int:
        """Rank r's actors made from ``rep``'s, node by node: -1 when every node and actor matched, else the
        position of the first that did not (r then holds a part of its actors). ``_node_alike`` is written
        out here: this loop runs once per op instance of every rank copied."""
        lw = self.lw
        actors, theirs, rnodes, rstarts = lw.actors[r], lw.actors[rep.rank], rep.nodes, rep.starts
        name_of, scope_of, ref, micro, local = lw.name, lw.scope, lw.ref, lw.phys.micro_batches > 1, self.local
        own, stage_of, bucket_of, node_alike = lw.own.get(r, ()), lw.stage_of[r], lw.bucket_of, self._node_alike
        append, fields_same = actors.append, self.fields_same
        for i, mn in enumerate(nodes):
            rn = rnodes[i]
            kind = mn.kind
            if kind == "compute" and not mn.accumulate:  # most nodes: a plain kernel
                # The logical op names the op, its phase, stage and output dtypes; its inputs (at the same
                # positions, made alike before it) set when it runs and the shapes it reads.
                ri, mi, ra, ma = rn.inputs, mn.inputs, rn.attrs, mn.attrs
                if rn.logical != mn.logical or rn.kind != kind or rn.out_shapes != mn.out_shapes \
                        or len(ri) != len(mi) or (ra is not ma and ra != ma and not _same_attrs(ra, ma)):
                    return i
                for x, y in zip(ri, mi):
                    if x.out != y.out or local[x.node] != local[y.node]:
                        return i
                append(None)  # made when the rank's actors are first asked for (``fill``), named n<id> as
                if own and mn.stage in own:  # ``_Lowering.node`` names it (``_Lowering.ref`` knows)
                    stage_of[f"n{mn.id}"] = mn.stage
                continue
            if kind == "source" and mn.op != "input":  # a state: made with its shard by ``fill``
                # A source's role, dtype, SBP, stage, phase and when are its tensor's (``expand.sources``),
                # and it reads nothing: the same tensor and local shape are all ``_node_alike`` would find.
                if rn.kind != kind or rn.op != mn.op or rn.logical != mn.logical or rn.out_shapes != mn.out_shapes:
                    return i
                append(None)
                if mn.stage in own:
                    stage_of[f"n{mn.id}"] = mn.stage
                continue
            if not node_alike(rn, mn):
                return i
            s = rstarts[i]
            if kind == "boxing" and mn.collective in bucket_of:  # ``_Lowering.node`` of a bucket member, direct
                before = len(actors)
                lw.bucket_member(mn)
                if (len(actors) != before or rstarts[i + 1] != s) and \
                        not _actors_match(theirs[s:rstarts[i + 1]], actors[before:]):
                    return i
                continue
            step = mn.attrs.get("plan_step") if kind == "boxing" else None
            lowering = step.kind_obj.lowering if step is not None and mn.collective not in bucket_of else None
            if kind == "source" or lowering in ("collective", "kernel"):
                ra = theirs[s]
                a = type(ra).__new__(type(ra))
                a.__dict__.update(ra.__dict__)
                name = a.name = name_of[mn.id] = f"n{mn.id}"
                scope_of[mn.id] = "micro" if mn.when == "each" and micro else "step"
                if lowering == "kernel":  # a local step (slice, zero fill): this rank's piece
                    fn, attrs = lw.local_kernel(mn)
                    if kernel_ref(fn) != ra.op or not _same_attrs(ra.attrs, attrs, ra.op):  # type: ignore[attr-defined]
                        return i
                    a.attrs, a.inputs = dict(attrs), (ref(mn.inputs[0]),)  # type: ignore[attr-defined]
                elif lowering == "collective":  # ``_Lowering.collective`` for this rank's group
                    kw = lw.collective_fields(mn)
                    key = (id(kw), id(ra))  # the members of one group share kw: compared once per group
                    same = fields_same.get(key)
                    if same is None:
                        same = fields_same[key] = not any(k != "src" and _norm(v) != ra.__dict__[k]
                                                          for k, v in kw.items())
                    if not same:
                        return i
                    name = a.name = name_of[mn.id] = f"c{mn.collective}"
                    a.inputs = (ref(mn.inputs[0]),)
                    a.group, a.order = tuple(mn.attrs["group"]), mn.collective  # type: ignore[attr-defined]
                    a.bytes_sent = int(step.bytes_sent.get(r, 0))  # type: ignore[attr-defined]
                    if "src" in kw:
                        a.src = kw["src"]  # type: ignore[attr-defined]
                actors.append(a)
                if mn.stage in own:
                    stage_of[name] = mn.stage
                continue
            before = len(actors)
            lw.node(mn)
            if not _actors_match(theirs[s:rstarts[i + 1]], actors[before:]):
                return i
        return -1

    def fill(self, r: int, slots: list) -> None:
        """Make in place member rank r's plain kernels and states, which ``_copy`` left None: its representative's
        actor at the same position with r's name, attributes, inputs and bucket slot (``into_buckets``), or with
        r's shard and update, exactly what ``_Lowering.node`` and ``_Lowering.updates`` make for the node (and
        what copying made before the member's actors were lazy)."""
        lw = self.lw
        rep = self.made_from[r]
        theirs, starts, refs, ref, into = lw.actors[rep.rank], rep.starts, lw.refs, lw.ref, self.into_of.get(r, {})
        new_compute, updates = Compute.__new__, lw.phys.state_updates
        for i, mn in enumerate(self.nodes_of[r]):
            kind = mn.kind
            if not ((kind == "compute" and not mn.accumulate) or (kind == "source" and mn.op != "input")):
                continue  # made with the plan (a node of no actor of its own starts where the next one does)
            p = starts[i]
            if slots[p] is not None:
                continue
            ra = theirs[p]
            if kind == "source":  # a state
                a = State.__new__(State)
                upd = updates.get(mn.logical, {}).get(r)
                a.__dict__ = {**ra.__dict__, "name": f"n{mn.id}", "update": None if upd is None else ref(upd),
                              "init": lw.initial_shard(mn.logical, r, mn.attrs["block"])}
                lw.states[(r, a.name)] = a
            else:
                a = new_compute(Compute)
                a.__dict__ = {**ra.__dict__, "name": f"n{mn.id}", "attrs": dict(mn.attrs),
                              "inputs": tuple([refs.get(id(y)) or ref(y) for y in mn.inputs]), "into": into.get(p)}
            slots[p] = a

    # --- after the nodes ----------------------------------------------------------------------------
    def groups(self) -> dict[int, tuple[int, ...]]:
        """Representative -> its members (itself first), after ``confirm`` dropped those the updates, sinks
        or buckets set apart."""
        return {rep.rank: tuple(rep.members) for rep in self.reps if len(rep.members) > 1}

    def into_buckets(self) -> None:
        """``gradients_into_buckets`` on each representative and on every rank lowered alone; a member gets the
        same producers written into its bucket (its wiring and ops are the representative's)."""
        acts = self.lw.actors
        for r, actors in acts.items():
            rep = self.rep_of.get(r)
            if rep is None or rep.rank == r:
                done = gradients_into_buckets(actors)
                if rep is not None:
                    pos = {id(a): i for i, a in enumerate(actors)}
                    rep.into = [(pos[id(p)], pos[id(k)], j) for p, k, j in done]
        for rep in self.reps:
            for m in rep.members[1:]:
                actors = acts[m]
                for p, k, j in rep.into:
                    pack = actors[k]
                    slot = pack.into
                    at = BufferSlot(slot.pool, pack.attrs["offsets"][j], pack.attrs["shapes"][j], slot.dtype)  # type: ignore[attr-defined]
                    if actors[p] is None:  # a kernel not made yet: ``fill`` gives it the slot
                        self.into_of.setdefault(m, {})[p] = at
                    else:
                        actors[p].into = at  # type: ignore[attr-defined]
                    flags = list(pack.attrs["in_place"])
                    flags[j] = True
                    pack.attrs["in_place"] = tuple(flags)

    def confirm(self) -> None:
        """Drop from its group a member whose state updates, sinks or actor count differ from its
        representative's (they are made after the nodes, per rank)."""
        phys, local, acts = self.lw.phys, self.local, self.lw.actors

        def at(ref) -> tuple[int, int] | None:
            return None if ref is None else (local[ref.node], ref.out)

        def tail(r: int) -> tuple:
            ups = tuple((at(per.get(r)), local[phys.sources[name][r]] if r in phys.sources.get(name, {}) else None)
                        for name, per in phys.state_updates.items())
            outs = tuple(at(per.get(r)) for per in phys.outputs.values())
            return at(phys.loss.get(r)), outs, ups, len(acts[r])

        for rep in self.reps:
            want = tail(rep.rank)
            kept = [m for m in rep.members if m == rep.rank or tail(m) == want]
            for m in rep.members:
                if m not in kept:  # lowered alone from here: its kernels are made now
                    self.fill(m, acts[m])
                    self.rep_of.pop(m, None)
            rep.members = kept


def _norm(v: object) -> object:
    """A collective field as ``Collective.__post_init__`` keeps it (sizes as a tuple of ints)."""
    return tuple(int(x) for x in v) if isinstance(v, list) else v  # type: ignore[union-attr]


def _actors_match(reps: list[Actor], mine: list[Actor]) -> bool:
    """The actors the ordinary lowering made for one node on two ranks agree in all but names, a collective's
    group, order, root and bytes sent, a state's values and where a local step's piece lies."""
    if len(reps) != len(mine):
        return False
    for a, b in zip(reps, mine):
        if type(a) is not type(b) or a.registers != b.registers or a.scope != b.scope or a.phase != b.phase \
                or len(a.inputs) != len(b.inputs) or [x.index for x in a.inputs] != [x.index for x in b.inputs]:
            return False
        if isinstance(a, Compute):
            if a.op != b.op or a.outputs != b.outputs or not _same_attrs(a.attrs, b.attrs, a.op) \
                    or (a.into is None) != (b.into is None):  # type: ignore[attr-defined]
                return False
        elif isinstance(a, Collective):
            if len(a.group) != len(b.group) or any(getattr(a, f) != getattr(b, f) for f in _COLL_FIELDS):  # type: ignore[attr-defined]
                return False
        elif isinstance(a, (Send, Recv)):  # the peer, tag and order may differ
            if isinstance(a, Recv) and (a.shape != b.shape or a.dtype != b.dtype):  # type: ignore[attr-defined]
                return False
        elif isinstance(a, State):
            if a.key != b.key or tuple(a.init.shape) != tuple(b.init.shape) or a.init.dtype != b.init.dtype:  # type: ignore[attr-defined]
                return False
        elif a.__dict__.keys() != b.__dict__.keys() or any(
                v != b.__dict__[k] for k, v in a.__dict__.items() if k not in ("name", "inputs")):
            return False
    return True
