"""Lowering: a deduced training graph becomes a physical graph (per-rank op instances, boxing
steps, one global collective order).

Nodes are made in one walk over the logical ops, so their order is topological and the order of
collectives is the order a single process would meet them; every rank follows that order.
Boxings are expanded step by step (one mesh axis at a time, or a move between placements, which
becomes ``send`` nodes on the sources and ``recv`` nodes on the destinations).
"""

from __future__ import annotations

from ...boxing.step import BoxingStep
from ...gc_pause import without_gc
from ...layout import local_block, local_shape
from ...ops.registry import get_op, local_context
from ...sbp import NdSbp
from ..deduction.deduce import Boxing, Deduction
from ..ir import GraphError
from .graph import PhysCollective, PhysicalGraph, PhysNode, PhysRef

# (placement, mesh axis) -> rank -> its group on that axis: a pure function of the placement, asked for every
# rank of every axis step, and the same for every strategy a search compiles on one mesh
_GROUPS: dict[tuple, dict[int, tuple[int, ...]]] = {}
_GROUPS_KEPT = 4096


class _Lowerer:
    def __init__(self, d: Deduction) -> None:
        self.d, self.g = d, d.graph
        self.nodes: list[PhysNode] = []
        self.colls: list[PhysCollective] = []
        self.stored: dict[str, dict[int, PhysRef]] = {}  # tensor -> rank -> where it is stored
        self.boxed: dict[int, dict[int, PhysRef]] = {}  # boxing -> rank -> its result (made for all ranks at once)
        if len(_GROUPS) > _GROUPS_KEPT:
            _GROUPS.clear()
        self._local: dict[tuple, dict[int, tuple]] = {}  # op's question -> rank -> its view; identical layers share
        # per (shape, placement, sbp) or (placement, axis): rank -> its answer; a placement hashes in Python,
        # so it is hashed once per question, not once per rank
        self._shapes: dict[tuple, dict[int, tuple[int, ...]]] = {}
        self._blocks: dict[tuple, dict[int, tuple]] = {}
        self._groups = _GROUPS

    def blocks(self, shape, pl, sbp) -> dict[int, tuple]:
        """Rank -> its local block of a ``shape`` tensor laid out ``(pl, sbp)`` (filled on first ask)."""
        return self._blocks.setdefault((shape, pl, sbp), {})

    def block(self, shape, pl, sbp, r) -> tuple:
        got = self.blocks(shape, pl, sbp)
        v = got.get(r)
        if v is None:
            v = got[r] = local_block(shape, pl, sbp, r)
        return v

    def lshapes(self, shape, pl, sbp) -> dict[int, tuple[int, ...]]:
        """Rank -> its local shape of a ``shape`` tensor laid out ``(pl, sbp)`` (filled by the caller)."""
        return self._shapes.setdefault((shape, pl, sbp), {})


    def local_views(self, op, metas, sig) -> dict[int | None, tuple]:
        """Rank -> (local attrs, input shapes, output shapes, output dtypes) of ``op``, filled by
        ``local_view``; one dict per distinct (op type, shapes, attrs, signature, placement)."""
        key = (op.type, tuple(metas), tuple(sorted(op.attrs.items())), sig, op.placement)
        views = self._local.get(key)
        if views is None:
            views = self._local[key] = {}
        return views

    def local_view(self, op, opdef, metas, sig, r, views) -> tuple:
        """(local attrs, input shapes, output shapes, output dtypes) of ``op`` on rank ``r``; the op's global
        outputs are inferred once for all ranks (kept in ``views`` under None)."""
        outs = views.get(None)
        if outs is None:
            outs = views[None] = tuple(opdef.infer(metas, op.attrs))
        ctx = local_context(opdef, metas, op.attrs, sig, op.placement, r, outs)
        if ctx is None:
            raise GraphError(f"op {op.name!r}: signature {sig} leaves rank {r} an empty shard")
        return (opdef.localize(dict(op.attrs), ctx), tuple(_shape(b) for b in ctx.in_blocks),
                tuple(_shape(b) for b in ctx.out_blocks), tuple(m.dtype for m in ctx.out_metas))

    def _when(self, inputs, phase: str) -> str:
        nodes = self.nodes
        each = False
        for ref in inputs:
            n = nodes[ref.node]
            if n.accumulate or n.when == "after":
                return "after"
            each = each or n.when == "each"
        if each:
            if phase == "update":
                if self.g.micro_batches > 1:
                    raise GraphError("an update reads a per-micro-batch value that was not accumulated")
                return "after"
            return "each"
        return "before"

    def add(self, **kw) -> PhysNode:
        if "when" not in kw:
            kw["when"] = self._when(kw["inputs"], kw["phase"])
        n = PhysNode(id=len(self.nodes), **kw)
        self.nodes.append(n)
        return n

    # --- sources -------------------------------------------------------------------------------
    def sources(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for name in self.g.sources():
            t = self.g.tensors[name]
            if not t.consumers and name not in self.g.state_updates:
                continue
            pl, sbp = self.d.placement[name], self.d.sbp[name]
            stage = self._stage_of_source(name)
            ids = out[name] = {}
            stored = self.stored.setdefault(name, {})
            blocks, role, dtypes, sbps = self.blocks(t.shape, pl, sbp), t.role, (t.meta.dtype,), (sbp,)
            when = "each" if role == "input" else "before"
            shapes: dict[tuple, tuple] = {}  # block -> (its shape,): ranks holding alike blocks share it
            nodes = self.nodes
            for r in pl.rank_list:  # ``add`` written out: one node per rank of every parameter and state
                block = blocks.get(r)
                if block is None:
                    block = blocks[r] = local_block(t.shape, pl, sbp, r)
                out_shapes = shapes.get(block)
                if out_shapes is None:
                    out_shapes = shapes[block] = (_shape(block),)
                i = len(nodes)
                nodes.append(PhysNode(i, r, "source", role, name, {"block": block, "sbp": sbp}, (), (), out_shapes,
                                      dtypes, sbps, "forward", stage, when))
                ids[r] = i
                stored[r] = PhysRef(i)
        return out

    def _stage_of_source(self, name: str) -> int:
        users = self.g.consumers(name)
        return users[0].stage if users else 0

    # --- boxing --------------------------------------------------------------------------------
    def box(self, b: Boxing) -> None:
        if b.id in self.boxed:
            return
        if b.source is not None:
            self.box(self.d.boxings[b.source])
            done = self.boxed[b.source]
            cur = {r: done[r] for r in b.src_placement.rank_list}
        else:
            stored = self.stored[b.tensor]
            cur = {r: stored[r] for r in b.src_placement.rank_list}
        shape = self.g.tensors[b.tensor].shape
        dtype = self.g.tensors[b.tensor].meta.dtype
        for k, step in enumerate(b.plan.steps):
            if step.mesh_axis is None:
                cur = self._move(b, k, step, cur, shape, dtype)
            else:
                cur = self._axis(b, k, step, cur, shape, dtype)
        self.boxed[b.id] = {r: cur[r] for r in b.dst_placement.rank_list}

    def _axis(self, b: Boxing, k: int, step: BoxingStep, cur, shape, dtype) -> dict[int, PhysRef]:
        pl, axis = step.placement, step.mesh_axis
        made: dict[int, PhysNode] = {}
        groups = self._groups.setdefault((pl, axis), {})
        src_shapes, dst_shapes = self.lshapes(shape, pl, step.src_sbp), self.lshapes(shape, pl, step.dst_sbp)
        nodes, when, kind, dtypes, sbps = self.nodes, self._when, step.kind, (dtype,), (step.dst_sbp,)
        for r in pl.rank_list:  # ``add`` written out: a ZeRO step has one such node per rank and parameter
            group = groups.get(r)
            if group is None:
                group = groups[r] = pl.group_of(r, axis)
            src, dst = src_shapes.get(r), dst_shapes.get(r)
            if src is None:
                src = src_shapes[r] = local_shape(shape, pl, step.src_sbp, r)
            if dst is None:
                dst = dst_shapes[r] = local_shape(shape, pl, step.dst_sbp, r)
            inputs = (cur[r],)
            n = made[r] = PhysNode(len(nodes), r, "boxing", kind, b.tensor,
                                   {"mesh_axis": axis, "group": group, "src_sbp": step.src_sbp,
                                    "dst_sbp": step.dst_sbp, "reduce_op": step.reduce_op, "plan_step": step},
                                   inputs, (src,), (dst,), dtypes, sbps, b.phase, b.stage, when(inputs, b.phase),
                                   boxing=b.id, step=k)
            nodes.append(n)
        if step.kind_obj.is_collective:
            for grp in step.groups:
                c = PhysCollective(index=len(self.colls), kind=step.kind, group=tuple(grp), mesh_axis=axis,
                               nodes=tuple(made[r].id for r in grp), bytes_sent={r: step.bytes_sent.get(r, 0) for r in grp},
                               boxing=b.id, step=k, phase=b.phase, when=made[grp[0]].when, reduce_op=step.reduce_op)
                self.colls.append(c)
                for r in grp:
                    made[r].collective = c.index
        return {r: PhysRef(n.id) for r, n in made.items()}

    def _move(self, b: Boxing, k: int, step: BoxingStep, cur, shape, dtype) -> dict[int, PhysRef]:
        src_pl, dst_pl = step.src_placement, step.placement
        sends: dict[int, PhysNode] = {}
        for s in src_pl.rank_list:
            out = [(t.dst_rank, t.block) for t in step.transfers if t.src_rank == s and t.dst_rank != s]
            if out:
                sends[s] = self.add(rank=s, kind="boxing", op="send", logical=b.tensor,
                                    attrs={"transfers": tuple(out), "src_sbp": step.src_sbp, "plan_step": step},
                                    inputs=(cur[s],), in_shapes=(local_shape(shape, src_pl, step.src_sbp, s),),
                                    out_shapes=(), out_dtypes=(), out_sbps=(), phase=b.phase, stage=b.stage,
                                    boxing=b.id, step=k)
        recvs: dict[int, PhysNode] = {}
        for d in dst_pl.rank_list:
            froms = [(t.src_rank, t.block) for t in step.transfers if t.dst_rank == d]
            inputs = [PhysRef(sends[s].id) for s in sorted({s for s, _ in froms if s != d})]
            local = any(s == d for s, _ in froms)
            if local:
                inputs.append(cur[d])
            recvs[d] = self.add(rank=d, kind="boxing", op="recv", logical=b.tensor,
                                attrs={"transfers": tuple(froms), "dst_sbp": step.dst_sbp,
                                       "local_input": len(inputs) - 1 if local else None, "plan_step": step},
                                inputs=tuple(inputs), in_shapes=tuple(() for _ in inputs),
                                out_shapes=(local_shape(shape, dst_pl, step.dst_sbp, d),), out_dtypes=(dtype,),
                                out_sbps=(step.dst_sbp,), phase=b.phase, stage=b.stage, boxing=b.id, step=k)
        for key in sorted({(t.src_rank, t.dst_rank) for t in step.transfers if t.src_rank != t.dst_rank}):
            nbytes = sum(x.numel for x in step.transfers if (x.src_rank, x.dst_rank) == key) * dtype.itemsize
            c = PhysCollective(index=len(self.colls), kind="send_recv", group=key, mesh_axis=None,
                           nodes=(sends[key[0]].id, recvs[key[1]].id), bytes_sent={key[0]: nbytes},
                           boxing=b.id, step=k, phase=b.phase, when=recvs[key[1]].when)
            self.colls.append(c)
            sends[key[0]].collective = recvs[key[1]].collective = c.index
        return {r: PhysRef(n.id) for r, n in recvs.items()}

    # --- compute -------------------------------------------------------------------------------
    def compute(self) -> None:
        d, g = self.d, self.g
        for op in g.ops:
            choice = d.choices[op.name]
            for bid in choice.reads:
                if bid is not None:
                    self.box(d.boxings[bid])
            opdef = get_op(op.type)
            metas = [g.tensors[i].meta for i in op.inputs]
            sig = choice.signature
            views = self.local_views(op, metas, sig)
            # per input, rank -> where it is read from (its boxing's result, else where it is stored)
            srcs = [self.boxed[bid] if bid is not None else self.stored[t] for t, bid in zip(op.inputs, choice.reads)]
            outs = [self.stored.setdefault(o, {}) for o in op.outputs]
            out_sbps, acc = tuple(sig.outputs), op.type == "acc"
            nodes, when, phase = self.nodes, self._when, op.phase
            for r in op.placement.rank_list:
                v = views.get(r)
                if v is None:
                    v = views[r] = self.local_view(op, opdef, metas, sig, r, views)
                attrs, in_shapes, out_shapes, dtypes = v
                inputs = tuple([src[r] for src in srcs])
                n = PhysNode(len(nodes), r, "compute", op.type, op.name, dict(attrs), inputs, in_shapes,
                             out_shapes, dtypes, out_sbps, phase, op.stage, when(inputs, phase), acc)
                nodes.append(n)
                for j, stored in enumerate(outs):
                    stored[r] = PhysRef(n.id, j)
            for o in op.outputs:
                if o in d.store_boxing:
                    b = d.boxings[d.store_boxing[o]]
                    self.box(b)
                    stored, done = self.stored[o], self.boxed[b.id]
                    for r in b.dst_placement.rank_list:
                        stored[r] = done[r]


def _shape(block) -> tuple[int, ...]:
    return tuple(e - s for s, e in block)


@without_gc
def lower(d: Deduction) -> PhysicalGraph:
    """Expand a deduction into a ``PhysicalGraph``."""
    lw = _Lowerer(d)
    g = d.graph
    sources = lw.sources()
    lw.compute()
    updates = {}
    for old, new in g.state_updates.items():
        bid = d.write_backs.get(old)
        if bid is not None:
            lw.box(d.boxings[bid])
            updates[old] = {r: lw.boxed[bid][r] for r in d.placement[old].rank_list}
        else:
            updates[old] = {r: lw.stored[new][r] for r in d.placement[old].rank_list}
    loss = g.loss_value or g.loss
    if loss is None:
        raise GraphError("the graph has no loss; compile a training graph")
    ranks = sorted({n.rank for n in lw.nodes})
    outputs = {gr: {r: lw.stored[gr][r] for r in d.placement[gr].rank_list} for gr in g.grads.values()}
    sbp: dict[str, NdSbp] = {s: d.sbp[s] for s in sources}
    return PhysicalGraph(
        nodes=lw.nodes, collectives=lw.colls, ranks=tuple(ranks), micro_batches=g.micro_batches, sources=sources,
        source_sbp=sbp, source_placement={s: d.placement[s] for s in sources}, state_updates=updates,
        loss={r: lw.stored[loss][r] for r in d.placement[loss].rank_list}, loss_sbp=d.sbp[loss],
        loss_placement=d.placement[loss], outputs=outputs, output_sbp={o: d.sbp[o] for o in outputs},
        output_placement={o: d.placement[o] for o in outputs},
    )
