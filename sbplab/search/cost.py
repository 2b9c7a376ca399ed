"""The one analytic cost model every search method shares.

Per forward op and n-D signature: compute time of the op on its local shapes (``hw.op_time``: a
measured figure where the Hardware was calibrated, else a roofline) plus its backward ops, which run
on the mirrored layout and so do the same fraction of their global work. Per edge between two forward
ops: the boxing the consumer's signature needs (forward) and the boxing the gradient needs on its way
back (backward), both priced by the boxing planner (exact bytes, alpha-beta time) and cached. Per
parameter: the gradient synchronisation its read layout implies (a ``B`` read under a split op gives a
``P`` gradient: an all-reduce, or a reduce-scatter under ZeRO), ZeRO's gathers, the update's memory
traffic and the bytes of parameter, gradient and optimizer state per device.

Gradient reductions run in buckets (``Strategy.bucket_mb``, as DDP; ``lowering/buckets.py``): one
collective per bucket pays the latency (alpha x rounds) once for all its gradients. A sum over
parameters cannot know how they will be grouped, so each reduction pays its bandwidth term in full and
the bucket's share of the latency, ``min(1, its bytes / bucket bytes)``: a bucket of small gradients
costs about one latency, a gradient as large as a bucket pays its own. (The exact count, one latency
per started bucket, is a step function the linear model leaves to the simulator's re-rank.)

Backward layouts follow from the forward ones, per mesh axis: the gradient of an input read ``S(d)`` is
``S(d)``; of an input read ``P`` it is ``B``; of an input read ``B`` it is ``B`` when the whole op is
replicated on that axis and ``P`` when the op is split there (each rank saw only its part). The
gradient arriving at an output must match it: ``S(d)`` for ``S(d)``, ``B`` for ``B`` or ``P``.
That is what deduction then finds for the backward ops, up to its greedy choices.

Step time of a candidate: the sum of all of it (ops run one after another on every rank); a pipeline
takes the slowest stage per micro-batch times (M + S - 1), the bubble, plus the slowest stage's
once-per-step work (see ``pipeline.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..compiler.deduction.caches import freeze
from ..compiler.deduction.strategy import DEFAULT_BUCKET_MB
from ..compiler.ir import Graph, OpNode
from ..hardware import Hardware, op_key
from ..layout import LayoutError, check_layout, local_shape, numel
from ..ops.registry import NdSignature, TensorMeta, get_op, local_context
from ..placement import Placement
from ..sbp import B, Broadcast, NdSbp, Partial, S, Split
from ..sim.firing_cost import device_of
from .box_floors import FloorBoxes
from .box_prices import BoxPrices

ZERO_LEVELS = (0, 2, 3)  # 0: replicated state; 2: gradients and optimizer state sharded; 3: parameters too



@dataclass(frozen=True)
class ParamLayout:
    """How one parameter is kept under a signature and ZeRO level."""

    read: NdSbp  # as the forward op reads it
    stored: NdSbp  # as it is kept between steps (ZeRO-3 shards it)
    grad: NdSbp  # what its gradient is reduced to (ZeRO-2/3: sharded)
    state: NdSbp  # optimizer state
    kept: NdSbp  # as it would be kept without ZeRO: ``read`` with every P made B

    @property
    def sharded(self) -> bool:
        """ZeRO shards its gradient and optimizer state (and, at level 3, the parameter itself)."""
        return self.grad != self.kept


def dual(sig: NdSignature, k: int) -> NdSbp:
    """The SBP of the gradient of input ``k`` under ``sig`` (see the module docstring)."""
    out = []
    for a, x in enumerate(sig.inputs[k]):
        if isinstance(x, Split):
            out.append(x)
        elif isinstance(x, Partial):
            out.append(B)
        else:
            split_here = any(not isinstance(t[a], Broadcast) for t in (*sig.inputs, *sig.outputs))
            out.append(Partial() if split_here else B)
    return tuple(out)


def mirror(sbp: NdSbp) -> NdSbp:
    """The SBP the gradient of an output of layout ``sbp`` must arrive in."""
    return tuple(B if isinstance(x, Partial) else x for x in sbp)


class Pricer:
    """Prices ops, edges and parameters on one mesh; every price in seconds or bytes per device."""

    def __init__(self, graph: Graph, placement: Placement, hw: Hardware,
                 boxes: BoxPrices | FloorBoxes | None = None, bucket_mb: float = DEFAULT_BUCKET_MB,
                 work_scale: float = 1.0) -> None:
        self.graph, self.placement, self.hw = graph, placement, hw
        # compute priced at this fraction of each op's FLOPs and bytes: a floor under a micro-batch of
        # 1/m of the batch is priced at 1/m (``Space.pre_floor``), without its graph being traced
        self.work_scale = work_scale
        self.device = device_of(hw)  # a device-free mesh prices its ops on the hardware's device
        self.bucket_bytes = bucket_mb * 2**20  # 0: every gradient reduction runs alone
        self.rank = placement.rank_list[0]
        boxes = boxes or BoxPrices()
        self.latency_only = getattr(boxes, "latency_only", False)  # moves priced without their bytes too
        self.boxes = boxes.for_mesh(placement, hw)  # shared by every mesh of this shape and links
        self._compute: dict[tuple, float] = boxes.compute_times(placement.shape)  # and of this shape
        self.backward_of: dict[str, list[OpNode]] = {}
        for op in graph.ops:
            if op.phase == "backward" and op.forward_op is not None:
                self.backward_of.setdefault(op.forward_op, []).append(op)
        self._edges: dict[tuple, np.ndarray] = {}
        self.local_bytes = lru_cache(maxsize=None)(self._local_bytes)  # type: ignore[method-assign]
        self._params: dict[tuple, tuple[float, float, int]] = {}

    # --- layouts -------------------------------------------------------------------------------
    def _local_bytes(self, meta: TensorMeta, sbp: NdSbp) -> int:
        return numel(local_shape(meta.shape, self.placement, sbp, self.rank)) * meta.dtype.itemsize

    def fits(self, meta: TensorMeta, sbp: NdSbp) -> bool:
        """Every rank gets a non-empty shard (a 2-row tensor does not split 8 ways)."""
        try:
            check_layout(meta.shape, self.placement, sbp)
        except LayoutError:
            return False
        return True

    def param_layout(self, meta: TensorMeta, read: NdSbp, zero: int) -> ParamLayout:
        """ZeRO shards dim 0 on the first mesh axis where the read layout is ``B`` (a data-parallel
        axis); a tensor too small to split there stays as read (the zero preset's ``only_if_fits``).

        A parameter is never kept as a partial sum (an optimizer update is not linear, so it has no
        ``P`` signature): one read ``P`` (a bias added to a partial product) is kept ``B`` and read ``P``
        by a local step (rank 0 keeps it, the others add zeros); its gradient, the dual of a ``P`` read,
        is ``B`` already."""
        kept = tuple(B if isinstance(x, Partial) else x for x in read)
        if zero == 0 or not meta.shape:
            return ParamLayout(read, kept, kept, kept, kept)
        for a, x in enumerate(kept):
            if isinstance(x, Broadcast):
                shard = kept[:a] + (S(0),) + kept[a + 1:]
                if self.fits(meta, shard):
                    return ParamLayout(read, shard if zero >= 3 else kept, shard, shard, kept)
        return ParamLayout(read, kept, kept, kept, kept)

    # --- time ----------------------------------------------------------------------------------
    def box_time(self, meta: TensorMeta, src: NdSbp, dst: NdSbp) -> float:
        """Seconds of the boxing plan that turns ``src`` into ``dst`` on this mesh (``plan_boxing``'s
        ``time_s``, from the search's shared tables)."""
        return self.boxes.time(meta, src, dst)

    def p2p_time(self, meta: TensorMeta, sbp: NdSbp) -> float:
        """One stage-to-stage move of a tensor laid out ``sbp`` (each rank sends its block); its latency alone
        where the boxings are priced so (``FloorBoxes(latency_only=True)``)."""
        return self.hw.p2p_time(1, 0 if self.latency_only else self.local_bytes(meta, sbp))

    def _roofline(self, flops: float, nbytes: float, dtype) -> float:
        return max(flops / self.hw.flops_for(dtype), nbytes / self.hw.mem_bandwidth)

    def compute_key(self, op: OpNode) -> tuple:
        """What an op's compute time depends on besides its signature: identical layers share it."""
        g = self.graph
        return (op.type, tuple(g.tensors[i].meta for i in op.inputs), freeze(op.attrs),
                tuple((b.type, tuple(g.tensors[i].meta for i in b.inputs)) for b in self.backward_of.get(op.name, ())))

    def compute_time(self, op: OpNode, sig: NdSignature, op_key: tuple | None = None) -> float:
        """Forward op on its local shapes, plus its backward ops at the same fraction of their work
        (cached per op structure, ``compute_key``: identical layers are priced once)."""
        key = (op_key if op_key is not None else self.compute_key(op), sig)
        if self.work_scale != 1.0:
            key = (*key, self.work_scale)
        t = self._compute.get(key)
        if t is None:
            t = self._compute[key] = self._compute_time(op, sig)
        return t

    def _compute_time(self, op: OpNode, sig: NdSignature) -> float:
        g = self.graph
        d = get_op(op.type)
        ins = [g.tensors[i].meta for i in op.inputs]
        outs = [g.tensors[o].meta for o in op.outputs]
        dtype = outs[0].dtype if outs else ins[0].dtype
        glob_flops = float(d.flops(ins, outs, op.attrs))
        glob_bytes = float(d.bytes_moved(ins, outs))
        ctx = local_context(d, ins, op.attrs, sig, self.placement, self.rank)
        if ctx is None:
            return float("inf")
        lin = [TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ctx.in_blocks, ins)]
        lout = [TensorMeta(tuple(e - s for s, e in blk), m.dtype) for blk, m in zip(ctx.out_blocks, outs)]
        try:
            flops = float(d.flops(lin, lout, d.localize(dict(op.attrs), ctx)))
        except Exception:  # a FLOP formula that cannot take local attrs: scale the global one
            flops = glob_flops * (sum(m.numel for m in lout) / max(1, sum(m.numel for m in outs)))
        nbytes = float(d.bytes_moved(lin, lout))
        key = op_key(op.type, [m.shape for m in lin], dtype, self.placement.device_type or self.device)
        frac = flops / glob_flops if glob_flops > 0 else nbytes / max(1.0, glob_bytes)
        flops, nbytes, frac = flops * self.work_scale, nbytes * self.work_scale, frac * self.work_scale
        fwd = self.hw.op_time(key, flops, nbytes, dtype)[0]
        bwd = 0.0
        for b in self.backward_of.get(op.name, ()):
            bd = get_op(b.type)
            bi = [g.tensors[i].meta for i in b.inputs]
            bo = [g.tensors[o].meta for o in b.outputs]
            try:
                bf = float(bd.flops(bi, bo, b.attrs))
            except Exception:
                bf = 0.0
            bwd += self._roofline(bf * frac, bd.bytes_moved(bi, bo) * frac, dtype)
        return fwd + bwd

    def rereads(self, op: OpNode, pos: int) -> bool:
        """Does a backward op of ``op`` read its input ``pos`` again (a weight gradient's ``mm`` reads x)? Then
        that read boxes it again in backward: deduction shares a boxing within a phase, and a stage
        keeps what it received for backward only across placements."""
        t = op.inputs[pos]
        return any(t in b.inputs for b in self.backward_of.get(op.name, ()))

    def edge_matrix(self, meta: TensorMeta, outs: tuple[NdSbp, ...],
                    ins: tuple[tuple[NdSbp, NdSbp | None], ...], reread: bool = False) -> np.ndarray:
        """Seconds of an edge for every (producer layout, (consumer layout, gradient layout)) pair: the
        forward boxing to the consumer (twice when its backward reads it again, ``rereads``) and, when the
        tensor has a gradient, the gradient's boxing back to the layout the producer's backward needs.
        Identical layers ask identical questions, so whole matrices are cached."""
        key = (meta, outs, ins, reread)
        m = self._edges.get(key)
        if m is None:
            m = self._edges[key] = self.read_matrix(meta, outs, ins, reread, [mirror(o) for o in outs])
        return m

    def read_matrix(self, meta: TensorMeta, have: Sequence[NdSbp], ins: Sequence[tuple[NdSbp, NdSbp | None]],
                    reread: bool, grad_to: Sequence[NdSbp]) -> np.ndarray:
        """[have, ins]: boxing each layout in ``have`` into each read layout (twice when ``reread``), plus,
        where a read has a gradient layout, that gradient's boxing back to ``grad_to`` (one per ``have``)."""
        m = self.boxes.matrix(meta, have, [i for i, _ in ins])
        if reread:
            m *= 2
        grads = list(dict.fromkeys(g for _, g in ins if g is not None))
        if grads:
            back = self.boxes.matrix(meta, grads, grad_to)  # [grads, have]
            at = {g: k for k, g in enumerate(grads)}
            for c, (_, g) in enumerate(ins):
                if g is not None:
                    m[:, c] += back[at[g]]
        return m

    def grad_reduce_time(self, meta: TensorMeta, src: NdSbp, dst: NdSbp) -> float:
        """A parameter gradient's reduction from ``src`` to ``dst``, run in a bucket: its bandwidth term and
        its share of the bucket's latency (see the module docstring)."""
        t = self.box_time(meta, src, dst)
        if self.bucket_bytes <= 0 or t == 0.0:
            return t
        lat = self.boxes.bucketable_latency(meta, src, dst)
        return t - lat + lat * min(1.0, self.local_bytes(meta, src) / self.bucket_bytes)

    def param_costs(self, meta: TensorMeta, sig: NdSignature, k: int, zero: int,
                    n_states: int) -> tuple[float, float, int]:
        """(seconds per micro-batch: ZeRO-3 gathers; seconds per step: gradient sync, write-back and
        update; bytes per device: parameter, gradient and optimizer state) of input ``k``, a parameter.
        They depend on the signature only through the parameter's read layout and its gradient's, which
        many signatures of an op share: kept per those."""
        key = (meta, sig.inputs[k], dual(sig, k), zero, n_states)
        got = self._params.get(key)
        if got is None:
            got = self._params[key] = self._param_costs(*key)
        return got

    def _param_costs(self, meta: TensorMeta, read: NdSbp, grad: NdSbp, zero: int,
                     n_states: int) -> tuple[float, float, int]:
        lay = self.param_layout(meta, read, zero)
        gather = 2 * self.box_time(meta, lay.stored, lay.read)  # forward and backward each gather (ZeRO-3)
        sync = self.grad_reduce_time(meta, grad, lay.grad)
        if lay.grad != lay.stored:  # ZeRO-2: the update runs on shards, the new parameter is gathered back
            sync += self.box_time(meta, lay.grad, lay.stored)
        upd = self.local_bytes(meta, lay.grad)
        sync += (2 + 2 * n_states) * upd / self.hw.mem_bandwidth  # read param, grad, states; write them back
        mem = self.local_bytes(meta, lay.stored) + upd + n_states * self.local_bytes(meta, lay.state)
        return gather, sync, mem
