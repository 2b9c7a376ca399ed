"""Physical graph -> ActorPlan: every op instance becomes an actor on its rank.

- input sources become ``Source`` actors (the driver cuts the batch), parameters and optimizer
  state become ``State`` actors initialised from the graph's values and updated by the node the
  compiler names as their new value;
- compute nodes become ``Compute`` actors with their localized attributes; an ``acc`` node is its
  per-micro-batch term followed by an ``Accumulate``;
- boxing steps: collectives become ``Collective`` actors (one name per group, so members match),
  local steps (slice, zero) become small kernels, and moves between placements become a
  ``take_block -> Send`` per transfer on the source and ``Recv``s plus a ``put_blocks`` on the
  destination;
- the loss (and, if asked, the gradients) go to ``Sink`` actors.

Micro-batch scope follows the node's ``when``: "each" fires per micro-batch, "before" and "after"
once per step. In a pipeline, each rank's compute follows its schedule's action list
(``compiler.pipeline.schedules``, filed on the rank as a ``RankSchedule``), and a micro-batch actor
of stage s keeps max(2, in flight) registers, in flight being the most micro-batches the schedule
has between their forward and backward on s (GPipe: all of them, 1F1B: S - s, OneFlow's rule);
step actors keep 1 or 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...boxing.kinds import kernel_ref, kind_of
from ...gc_pause import without_gc
from ...layout import Block, holds_value, local_block, shard
from ...runtime.actor_plan import ActorPlan, CommSlot
from ...runtime.pipeline_order import RankSchedule, in_flight
from ...runtime.specs import (
    Accumulate,
    Actor,
    Collective,
    Compute,
    PlanError,
    Recv,
    Ref,
    Send,
    Sink,
    Source,
    State,
    Zeros,
)
from ..deduction.strategy import DEFAULT_BUCKET_MB
from ..pipeline.schedules import pipeline_actions
from .bucket_actors import bucket_actors
from .bucket_views import gradients_into_buckets
from .buckets import plan_buckets
from .grouped import GroupedLowering

if TYPE_CHECKING:
    from ..ir import Graph
    from ..physical.graph import PhysicalGraph, PhysNode


class _Lowering:
    def __init__(self, phys: PhysicalGraph, graph: Graph, registers: int | None, bucket_mb: float,
                 schedule: str | None = None) -> None:
        self.phys, self.graph = phys, graph
        self.stages = 1 + max((n.stage for n in phys.nodes), default=0)
        self.fixed = registers
        self.stage_of: dict[int, dict[str, int]] = {r: {} for r in phys.ranks}  # rank -> actor -> stage
        self.own: dict[int, set[int]] = {}  # rank -> the stages whose ops it runs
        self.actions, self.in_flight = self.pipeline(schedule or "1f1b")
        self.actors: dict[int, list[Actor]] = {r: [] for r in phys.ranks}
        self.name: dict[int, str] = {}
        self.scope: dict[int, str] = {}
        self.tags: dict[tuple, int] = {}
        self.p2p: dict[tuple[int, int], list[tuple[int, str]]] = {}  # (node, peer) -> [(rank, actor)]
        self.states: dict[tuple[int, str], State] = {}  # (rank, actor name) -> its State
        self.initial: dict[str, dict[int, torch.Tensor]] = {}  # tensor -> rank -> shard, cut when first asked
        self.buckets = plan_buckets(phys, graph, bucket_mb * 2**20)
        self.bucket_of = {c: b for b in self.buckets for c in b.collectives}  # collective index -> its bucket
        self.bucket_pos = {c: i for b in self.buckets for i, c in enumerate(b.collectives)}  # its place there
        self.waiting: dict[tuple[int, int], list[PhysNode]] = {}  # (bucket, rank) -> members lowered so far
        self.alias: dict[int, Ref] = {}  # node -> the register that holds its output (a bucket's view)
        self.bucket_views: dict[int, Ref] = {}  # collective index -> its bucket's view (``bucket_member``)
        self.refs: dict[int, Ref] = {}  # id of a PhysRef (node, output) -> its register
        self.coll_attrs: dict[tuple, dict] = {}  # (plan step, group, input shape) -> the Collective's fields
        self.bucket_layouts: dict[tuple, tuple] = {}  # (bucket, group, shapes) -> its layout (``bucket_actors``)

    def initial_shard(self, name: str, rank: int, block: Block) -> torch.Tensor | Zeros:
        """This rank's start value of ``name``, whose source node holds ``block`` (``local_block`` of
        the source's placement and SBP): the executor's cut (so both agree), or ``Zeros`` described
        rather than made (optimizer states: gigabytes for a large model)."""
        t = self.graph.tensors[name]
        pl, sbp = self.phys.source_placement[name], self.phys.source_sbp[name]
        if t.value is None and t.init == "zeros":
            return Zeros(tuple([e - s for s, e in block]), t.meta.dtype)
        full = t.initial_value()
        if all(e - s == n for (s, e), n in zip(block, t.shape)) and holds_value(pl, sbp, rank):
            return full  # a whole copy: every such rank shares it (each worker copies its init anyway)
        if name not in self.initial:
            self.initial[name] = shard(full, pl, sbp, f"tensor {name!r}")
        return self.initial[name][rank]

    def pipeline(self, schedule: str) -> tuple[dict[int, tuple], dict[int, int]]:
        """Per stage, the action list of the pipeline rank holding it, and how many micro-batches the
        schedule keeps in flight there. Stages on the same ranks belong to one pipeline rank (several
        of them under interleaved 1F1B: stage s on pipeline rank s % n)."""
        if self.stages == 1 or self.fixed is not None:  # hand-set registers: they alone bound the order
            return {}, {}
        ranks: dict[int, set[int]] = {}
        for n in self.phys.nodes:
            if n.kind != "boxing":  # a transfer's sending half is filed under the stage it feeds
                ranks.setdefault(n.stage, set()).add(n.rank)
                self.own.setdefault(n.rank, set()).add(n.stage)
        n_pipe = len({frozenset(v) for v in ranks.values()})
        if self.stages % n_pipe or any(ranks.get(s) != ranks.get(s % n_pipe) for s in range(self.stages)):
            raise PlanError(f"{self.stages} pipeline stages on {n_pipe} distinct rank sets: a schedule needs stage s "
                            f"on the ranks of stage s % {n_pipe}")
        per_rank = pipeline_actions(schedule, n_pipe, self.phys.micro_batches, self.stages // n_pipe)
        actions = {s: per_rank[s % n_pipe] for s in range(self.stages)}
        return actions, {s: in_flight(actions[s]).get(s, 1) for s in range(self.stages)}

    def schedules(self, name: str | None) -> dict[int, RankSchedule]:
        """Each rank's schedule: the action list of the pipeline rank of its (first) stage."""
        if not self.actions:
            return {}
        return {r: RankSchedule(name or "1f1b", self.actions[min(own)], self.stage_of[r])
                for r, own in self.own.items()}

    def regs(self, n: PhysNode) -> int:
        if self.fixed is not None:
            return self.fixed
        if n.when != "each":
            return 2
        return max(2, self.in_flight[n.stage]) if self.in_flight else max(2, self.stages - n.stage)

    def ref(self, r: Any) -> Ref:
        """The register holding physical output ``r`` (asked once its node is lowered, as nodes come in
        order); one Ref per output, shared by its readers (a Ref is immutable)."""
        key = id(r)  # the physical graph's outputs are PhysRef objects its readers share, alive as long as it
        got = self.refs.get(key)
        if got is None:
            # a node grouped lowering checked but did not make (``GroupedLowering.fill``) has the ordinary name
            got = self.refs[key] = self.alias.get(r.node) or Ref(self.name.get(r.node) or f"n{r.node}", r.out)
        return got

    def scope_of(self, i: int) -> str:
        """The firing scope of node i's actor: as ``node`` sets it (grouped lowering leaves a member's plain
        kernels and states to ``GroupedLowering.fill``, which makes them as ``node`` does)."""
        got = self.scope.get(i)
        if got is None:
            n = self.phys.nodes[i]
            got = "step" if n.accumulate or n.when != "each" or self.phys.micro_batches == 1 else "micro"
        return got

    def tag(self, key: tuple) -> int:
        return self.tags.setdefault(key, len(self.tags))

    def add(self, n: PhysNode, *actors: Actor) -> None:
        self.actors[n.rank].extend(actors)
        if n.stage in self.own.get(n.rank, ()):  # not the local steps of a transfer to another stage
            self.stage_of[n.rank].update((a.name, n.stage) for a in actors)

    # --- one node -------------------------------------------------------------------------------
    def node(self, n: PhysNode) -> None:
        # with one micro-batch, "each" and "after" coincide: everything fires once per step
        scope = "micro" if n.when == "each" and self.phys.micro_batches > 1 else "step"
        name = self.name[n.id] = f"n{n.id}"
        self.scope[n.id] = "step" if n.accumulate else scope
        if n.kind == "compute" and not n.accumulate:  # most nodes: one kernel
            self.add(n, Compute(name, op=n.op, attrs=n.attrs, inputs=tuple(map(self.ref, n.inputs)),
                                outputs=len(n.out_shapes), phase=n.phase, scope=scope, registers=self.regs(n)))
            return
        common = dict(phase=n.phase, scope=scope, registers=self.regs(n))
        if n.kind == "source":
            self.source(n)
        elif n.kind == "compute" and n.accumulate:
            if len(n.inputs) != 1 or len(n.out_shapes) != 1:
                raise PlanError(f"node n{n.id}: acc nodes have one input and one output")
            if n.op == "acc":  # the kernel is scale * x: fold it into the accumulation
                self.add(n, Accumulate(f"n{n.id}", inputs=(self.ref(n.inputs[0]),), reduce="sum",
                                       scale=float(n.attrs.get("scale", 1.0)), phase=n.phase, registers=2))
                return
            self.add(n, Compute(f"n{n.id}.term", op=n.op, attrs=n.attrs,
                                inputs=tuple(map(self.ref, n.inputs)), **common))
            self.add(n, Accumulate(f"n{n.id}", inputs=(Ref(f"n{n.id}.term"),), reduce="sum", phase=n.phase,
                                   registers=2))
        elif n.kind == "boxing" and n.collective in self.bucket_of:
            self.bucket_member(n, common)
        elif n.kind == "boxing" and n.attrs["plan_step"].kind_obj.lowering == "collective":
            self.collective(n, common)
        elif n.kind == "boxing" and n.attrs["plan_step"].kind_obj.lowering == "kernel":
            self.local_step(n, common)
        elif n.op == "send":
            self.send(n, common)
        elif n.op == "recv":
            self.recv(n, common)
        else:
            raise PlanError(f"node n{n.id} ({n.kind} {n.op!r}) has no actor lowering")

    def source(self, n: PhysNode) -> None:
        name = n.logical
        pl, sbp = self.phys.source_placement[name], self.phys.source_sbp[name]
        t = self.graph.tensors[name]
        if t.role == "input":
            self.add(n, Source(f"n{n.id}", feed=name, placement=pl, sbp=sbp, registers=self.regs(n),
                               scope="micro" if self.phys.micro_batches > 1 else "step"))
            return
        st = State(f"n{n.id}", init=self.initial_shard(name, n.rank, n.attrs["block"]), key=name, placement=pl, sbp=sbp, registers=1)
        self.states[(n.rank, st.name)] = st
        self.add(n, st)

    def collective(self, n: PhysNode, common: dict) -> None:
        """One member of a group collective: the kind says the actor's fields and the bytes it sends."""
        step = n.attrs["plan_step"]
        group = tuple(n.attrs["group"])
        kw = self.collective_fields(n)
        if n.collective is None:
            raise PlanError(f"node n{n.id} ({n.op}) has no entry in the collective order")
        self.name[n.id] = f"c{n.collective}"
        self.add(n, Collective(f"c{n.collective}", kind_=step.kind, group=group, inputs=(self.ref(n.inputs[0]),),
                               order=n.collective, mesh_axis=step.mesh_axis,
                               bytes_sent=int(step.bytes_sent.get(n.rank, 0)), **kw, **common))

    def collective_fields(self, n: PhysNode) -> dict:
        """The kind's fields of collective node ``n``'s actor (sizes, dims, root), made once per group."""
        step = n.attrs["plan_step"]
        key = (id(step), tuple(n.attrs["group"]), n.in_shapes[0])  # the members of a group ask alike (a step lives as long as phys)
        kw = self.coll_attrs.get(key)
        if kw is None:
            shape = self.graph.tensors[n.logical].shape
            kw = self.coll_attrs[key] = step.kind_obj.collective_attrs(step, key[1], n.in_shapes[0], shape)
        return kw

    def bucket_member(self, n: PhysNode, common: dict | None = None) -> None:
        """A gradient reduction that runs in a bucket: its output is a view the bucket's unpack hands
        out; the bucket's actors are made when its last member on this rank is lowered (``common``: the
        node's phase, scope and registers, made then when not given)."""
        b = self.bucket_of[n.collective]  # type: ignore[index]
        pos = self.bucket_pos
        view = self.bucket_views.get(n.collective)  # type: ignore[arg-type]
        if view is None:  # the same register name on every rank: one Ref per bucket place (a Ref is immutable)
            view = self.bucket_views[n.collective] = Ref(f"b{b.index}.unpack", pos[n.collective])  # type: ignore[index]
        self.alias[n.id] = view
        self.name[n.id] = view.actor
        members = self.waiting.setdefault((b.index, n.rank), [])
        members.append(n)
        if len(members) == len(b.collectives):
            members.sort(key=lambda m: pos[m.collective])  # type: ignore[index]
            if common is None:
                common = dict(phase=n.phase, scope=self.scope_of(n.id), registers=self.regs(n))
            self.add(n, *bucket_actors(b, members, [self.ref(m.inputs[0]) for m in members], self.graph, common,
                                       self.bucket_layouts))

    def local_step(self, n: PhysNode, common: dict) -> None:
        """A local step (slice, zero fill): the kind's own kernel, the one its in-process run calls."""
        fn, attrs = self.local_kernel(n)
        self.add(n, Compute(f"n{n.id}", op=kernel_ref(fn), attrs=attrs, inputs=(self.ref(n.inputs[0]),), **common))

    def local_kernel(self, n: PhysNode) -> tuple[Any, dict]:
        """The kernel and attributes of local step ``n`` on its rank."""
        step = n.attrs["plan_step"]
        return step.kind_obj.kernel(step, n.rank, n.in_shapes[0], self.graph.tensors[n.logical].shape)

    def _transfer_key(self, n: PhysNode, src: int, dst: int, block) -> tuple:
        return (n.boxing, n.step, src, dst, tuple(block))

    def send(self, n: PhysNode, common: dict) -> None:
        step = n.attrs["plan_step"]
        src_block = local_block(self.graph.tensors[n.logical].shape, step.src_placement, step.src_sbp, n.rank)
        for j, (dst, block) in enumerate(n.attrs["transfers"]):
            fn, attrs = step.kind_obj.take_kernel(block, src_block)
            self.add(n, Compute(f"n{n.id}.take{j}", op=kernel_ref(fn), attrs=attrs,
                                inputs=(self.ref(n.inputs[0]),), **common))
            self.p2p.setdefault((n.id, dst), []).append((n.rank, f"n{n.id}.send{j}"))
            self.add(n, Send(f"n{n.id}.send{j}", inputs=(Ref(f"n{n.id}.take{j}"),), peer=dst,
                             tag=self.tag(self._transfer_key(n, n.rank, dst, block)), order=n.collective or 0,
                             **common))

    def recv(self, n: PhysNode, common: dict) -> None:
        step = n.attrs["plan_step"]
        shape = self.graph.tensors[n.logical].shape
        dst_block = local_block(shape, step.placement, step.dst_sbp, n.rank)
        src_of_local = local_block(shape, step.src_placement, step.src_sbp, n.rank) \
            if n.rank in step.src_placement else None
        inputs, takes, puts = [], [], []
        for j, (src, block) in enumerate(n.attrs["transfers"]):
            put = tuple((s - o, e - o) for (s, e), (o, _) in zip(block, dst_block))
            if src == n.rank:
                local = n.inputs[n.attrs["local_input"]]
                inputs.append(self.ref(local))
                takes.append(tuple((s - o, e - o) for (s, e), (o, _) in zip(block, src_of_local)))
            else:
                bshape = tuple(e - s for s, e in block)
                tag = self.tag(self._transfer_key(n, src, n.rank, block))
                self.p2p.setdefault((n.id, src), []).append((n.rank, f"n{n.id}.recv{j}"))
                self.add(n, Recv(f"n{n.id}.recv{j}", peer=src, tag=tag, shape=bshape, dtype=n.out_dtypes[0],
                                 order=n.collective or 0, **common))
                inputs.append(Ref(f"n{n.id}.recv{j}"))
                takes.append(None)
            puts.append(put)
        fn, attrs = step.kind_obj.put_kernel(n.out_shapes[0], takes, puts)
        self.add(n, Compute(f"n{n.id}", op=kernel_ref(fn), inputs=tuple(inputs), attrs=attrs, **common))

    # --- the whole graph ------------------------------------------------------------------------
    def sinks(self, outputs: bool) -> None:
        phys = self.phys
        for r, ref in phys.loss.items():
            self.actors[r].append(Sink("loss.sink", inputs=(self.ref(ref),), key="loss",
                                       placement=phys.loss_placement, sbp=phys.loss_sbp,
                                       scope=self.scope_of(ref.node), micro_reduce="mean"))
        if not outputs:
            return
        for gname, per_rank in phys.outputs.items():
            for r, ref in per_rank.items():
                node = phys.nodes[ref.node]
                param = gname[:-5] if gname.endswith(".grad") else gname
                pl = phys.source_placement.get(param, phys.loss_placement)
                self.actors[r].append(Sink(f"{gname}.sink", inputs=(self.ref(ref),), key=gname, placement=pl,
                                           sbp=node.out_sbps[ref.out], scope=self.scope_of(ref.node),
                                           micro_reduce="sum"))

    def compiler_order(self) -> list[CommSlot]:
        """The physical graph's collective order as slots: before the loop, each micro-batch, after."""
        phys, M = self.phys, self.phys.micro_batches
        slots: dict[str, list[list[CommSlot]]] = {"before": [], "each": [], "after": []}
        for c in phys.collectives:
            b = self.bucket_of.get(c.index)
            if b is not None:  # the bucket goes out where its last gradient would have
                if c.index == b.collectives[-1]:
                    slots[c.when].append([CommSlot(phys.nodes[i].rank, f"b{b.index}", 0) for i in c.nodes])
                continue
            if kind_of(c.kind).between_placements:
                s_node, r_node = c.nodes
                names = self.p2p[(s_node, c.group[1])] + self.p2p[(r_node, c.group[0])]
            else:
                names = [(phys.nodes[i].rank, f"c{c.index}") for i in c.nodes]
            slots[c.when].append([CommSlot(r, a, 0) for r, a in names])
        step = M == 1
        out = [CommSlot(s.rank, s.actor, -1) for group in slots["before"] for s in group]
        for m in range(M):
            out += [CommSlot(s.rank, s.actor, -1 if step else m) for group in slots["each"] for s in group]
        out += [CommSlot(s.rank, s.actor, -1) for group in slots["after"] for s in group]
        return out

    def updates(self) -> None:
        """Each state's update; a state grouped lowering left unmade (``GroupedLowering.fill``) gets it when made."""
        states, sources = self.states, self.phys.sources
        for name, per_rank in self.phys.state_updates.items():
            for r, ref in per_rank.items():
                st = states.get((r, f"n{sources[name][r]}"))
                if st is not None:
                    st.update = self.ref(ref)


@without_gc
def lower_to_actors(phys: PhysicalGraph, graph: Graph, *, registers: int | None = None, outputs: bool = False,
                    name: str = "compiled", world_size: int | None = None,
                    order: str = "derive", bucket_mb: float = DEFAULT_BUCKET_MB,
                    schedule: str | None = None, by_group: bool = True) -> ActorPlan:
    """The ActorPlan of one training step of ``phys`` (lowered from ``graph``, which holds the values).

    registers: one register count for every actor instead of the schedule's; the plan then has no
        schedule, and each rank's compute lane runs whatever its registers allow, oldest micro-batch
        first (how far registers alone let a stage run ahead, ``viz/teaching``).
    outputs: also hand back the gradients (``result.outputs[grad name]``).
    order: "derive" (default): the global communication order comes from simulating the actors,
        which lets pipeline stages overlap and proves the register counts cannot deadlock;
        "compiler": the physical graph's own order (each micro-batch's communication in turn),
        replayed first and refused if the register counts would deadlock under it.
    bucket_mb: parameter-gradient reductions of one group are coalesced into buckets of about this
        size (torch DDP's default); 0 runs one collective per gradient (``lowering.buckets``).
    schedule: a pipeline's schedule (``compiler.pipeline.SCHEDULES``; None: "1f1b"), which orders
        each rank's micro-batch compute and sizes its registers.
    by_group: lower one rank per group of alike ranks and copy its actors to the others (``grouped.py``),
        recorded in ``ActorPlan.alike``; False lowers every rank on its own (the same plan, slower).
    """
    if order not in ("derive", "compiler"):
        raise ValueError(f"order must be 'derive' or 'compiler', got {order!r}")
    lw = _Lowering(phys, graph, registers, bucket_mb, schedule)
    grouped = GroupedLowering(lw) if by_group else None
    if grouped is not None:
        grouped.run()
    else:
        for n in phys.nodes:
            lw.node(n)
    lw.updates()
    lw.sinks(outputs)
    if grouped is not None:
        grouped.confirm()
        grouped.into_buckets()
    else:
        for actors in lw.actors.values():
            gradients_into_buckets(actors)
    device = phys.loss_placement.device_type
    size = world_size or (max(phys.ranks) + 1)
    # no ``imports``: workers only run kernels, and every op (gradient and optimizer ops too) is
    # registered by sbplab.ops, which the runtime imports to find them
    return ActorPlan.build(size, lw.actors, lw.schedules(schedule), grouped.fill if grouped is not None else None,
                           micro_batches=phys.micro_batches,
                           device_type=device, name=name,
                           comm_order=lw.compiler_order() if order == "compiler" else None,
                           alike=grouped.groups() if grouped is not None else None)
