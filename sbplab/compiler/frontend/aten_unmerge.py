"""Batched matmuls kept in the user's dims: attention's heads stay a dim of their own.

A 4-D matmul (``q @ k.transpose(-2, -1)`` on (B, nh, T, hs)) reaches the captured graph as torch's
composite decomposition: a view merging (B, nh) into one dim, a 3-D ``bmm``, a view splitting it again.
On the merged dim, a split over the heads is no split at all (rank r holds heads r·nh/p.. of *every*
batch row: a strided block), so no SBP signature carries tensor parallelism's head split through the
view, and attention stayed whole on every rank.

This pass undoes the merge where it is only a way to call ``bmm``: a ``bmm`` whose operands are
merge-views of 4-D tensors with the same leading dims (possibly transposed in their last two dims, as
the backward reads them) and whose only reader is the view back to 4-D becomes one ``aten.matmul`` on the
4-D tensors. Its rule splits any batch dim, so the heads' split passes through, as in Megatron's
attention. The values are the same (a batched matmul is a batched matmul); the merge-views left unread
go.
"""

from __future__ import annotations

from ...ops.aten.calls import Slot
from ..ir import Graph, OpNode

VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def unmerge_batched_matmuls(g: Graph, protected: set[str] = frozenset()) -> int:
    """Rewrite every merged ``bmm`` of ``g`` in place; returns how many. ``protected``: tensors that must
    keep their producer (gradients the caller holds by name)."""
    done, replaced = 0, {}  # replaced: removed op -> the matmul that took its place
    for bmm in [op for op in g.ops if op.type == "aten.bmm.default"]:
        done += _rewrite(g, bmm, protected, replaced)
    if done:
        _drop_unread_views(g, protected)
        for op in g.ops:  # a backward op names the forward op it differentiates: keep that name valid
            while op.forward_op is not None and op.forward_op not in g.op_by_name and op.forward_op in replaced:
                op.forward_op = replaced[op.forward_op]
    return done


def _rewrite(g: Graph, bmm: OpNode, protected: set[str], replaced: dict[str, str]) -> int:
    out = bmm.outputs[0]
    readers = g.consumers(out)
    if len(readers) != 1 or readers[0].type not in VIEWS or out in protected or out in g.outputs:
        return 0
    split = readers[0]
    lead = g.tensors[split.outputs[0]].shape[:-2]  # (B, nh)
    if len(lead) < 2 or g.tensors[split.outputs[0]].shape[-2:] != g.tensors[out].shape[1:]:
        return 0
    plans = [_unmerged(g, x, lead) for x in bmm.inputs]
    if any(p is None for p in plans):
        return 0
    at = g.ops.index(bmm)
    operands = []
    for source, transposed in plans:
        if transposed:  # the 3-D transpose(1, 2) of a merged tensor is the 4-D one's transpose(-2, -1)
            t = g.add_op("aten.transpose.int", [source], {"args": (Slot(0), -2, -1), "kwargs": ()},
                         name=f"{bmm.name}.unmerged_t", phase=bmm.phase, module=bmm.module, source=bmm.source,
                         forward_op=bmm.forward_op)
            _move(g, t, at)
            at += 1
            source = t.outputs[0]
        operands.append(source)
    name, readers_of_result = split.outputs[0], list(g.tensors[split.outputs[0]].consumers)
    role = g.tensors[name].role
    _remove(g, split)
    del g.tensors[name]
    mm = g.add_op("aten.matmul.default", operands, {"args": (Slot(0), Slot(1)), "kwargs": ()},
                  name=bmm.name, out_names=[name], phase=bmm.phase, module=bmm.module, source=bmm.source,
                  role=role, forward_op=bmm.forward_op)
    g.tensors[name].consumers = readers_of_result
    _move(g, mm, at)
    _remove(g, bmm)
    del g.tensors[out]
    replaced[split.name] = replaced[bmm.name] = mm.name
    for x in bmm.inputs:  # the merge-views (and transposes) it read, dropped once nobody reads them
        while (p := g.producer(x)) is not None and p.type in (*VIEWS, "aten.transpose.int") and p.name != mm.name:
            replaced.setdefault(p.name, mm.name)
            if p.type in VIEWS:
                break
            x = p.inputs[0]
    return 1


def _unmerged(g: Graph, x: str, lead: tuple[int, ...]) -> tuple[str, bool] | None:
    """(the 4-D tensor ``x`` merges, whether ``x`` is its transpose of the last two dims), or None."""
    transposed = False
    op = g.producer(x)
    if op is not None and op.type == "aten.transpose.int" and len(g.tensors[x].shape) == 3 \
            and sorted(d % 3 for d in op.attrs["args"][1:3]) == [1, 2]:
        transposed, x = True, op.inputs[0]
        op = g.producer(x)
    if op is None or op.type not in VIEWS:
        return None
    src = op.inputs[0]
    shape, merged = g.tensors[src].shape, g.tensors[x].shape
    if shape[:-2] != lead or merged[0] != lead[0] * lead[1] or merged[1:] != shape[-2:] or len(lead) != 2:
        return None
    return src, transposed


def _move(g: Graph, op: OpNode, at: int) -> None:
    g.ops.remove(op)
    g.ops.insert(at, op)


def _remove(g: Graph, op: OpNode) -> None:
    g.ops.remove(op)
    del g.op_by_name[op.name]
    for i in op.inputs:
        g.tensors[i].consumers.remove(op.name)


def _drop_unread_views(g: Graph, protected: set[str]) -> None:
    """Merge-views (and the transposes of them) nobody reads any more."""
    keep = protected | set(g.outputs) | set(g.state_updates.values()) | {g.loss}
    changed = True
    while changed:
        changed = False
        for op in reversed(g.ops):
            if op.type in (*VIEWS, "aten.transpose.int") and len(op.outputs) == 1 \
                    and not g.tensors[op.outputs[0]].consumers and op.outputs[0] not in keep:
                _remove(g, op)
                del g.tensors[op.outputs[0]]
                changed = True
