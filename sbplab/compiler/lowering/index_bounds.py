"""Which values an integer input may hold: the class indices and token ids a step indexes with.

A target of 100 where the model has 4 classes is the right shape and dtype, so only a worker would find
it, inside its loss kernel, and the run would fail and cost a respawn. The graph says which inputs index
which dims: follow each integer input through shape ops (and ``where``'s data operands, as the
decomposed cross-entropy uses) to the ops that index with it (embedding, gather, index_select, the
losses), and take the size of the dim they index. Values an op compares the input against before indexing
(``ne(target, -100)``: cross-entropy's ignore_index) are allowed too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir import Graph, GraphError

# shape ops that keep the values: (op type, the operand positions that carry them)
PASS = {t: (0,) for t in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                           "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.default",
                           "aten.flatten.using_ints", "aten.clone.default", "aten.slice.Tensor",
                           "aten.alias.default", "reshape", "view", "flatten")}
PASS["aten.where.self"] = (1, 2)
ALLOWED = ("aten.ne.Scalar", "aten.eq.Scalar")  # a value compared against is one the step handles


@dataclass(frozen=True)
class IndexBound:
    """Values of an input must lie in ``range(size)`` or be one of ``also``; ``op`` is who indexes."""

    size: int
    op: str
    also: tuple[int, ...] = ()


def _indexed_size(graph: Graph, op, pos: int) -> int | None:
    """The size of the dim ``op`` indexes with its operand ``pos``, or None if it does not index with it."""
    shape = lambda i: graph.tensors[op.inputs[i]].meta.shape  # noqa: E731
    args = (op.attrs or {}).get("args", ())
    if op.type == "aten.embedding.default" and pos == 1:
        return shape(0)[0]
    if op.type == "embedding" and pos == 0:
        return shape(1)[0]
    if op.type in ("aten.gather.default", "aten.index_select.default") and pos == (1 if "gather" in op.type else 2):
        dim = args[1] if len(args) > 1 and isinstance(args[1], int) else 0
        return shape(0)[dim]
    if op.type in ("aten.nll_loss_forward.default", "cross_entropy", "nll_loss") and pos == 1:
        logits = shape(0)
        return logits[1] if len(logits) >= 2 else logits[0]
    return None


def index_bounds(graph: Graph) -> dict[str, IndexBound]:
    """Per integer graph input that some op indexes with, the values it may hold."""
    consumers: dict[str, list[tuple[object, int]]] = {}
    for op in graph.ops:
        if op.phase == "forward":
            for pos, name in enumerate(op.inputs):
                consumers.setdefault(name, []).append((op, pos))
    out: dict[str, IndexBound] = {}
    for name in graph.inputs:
        meta = graph.tensors[name].meta
        if meta.dtype.is_floating_point or meta.dtype == torch.bool:
            continue
        sizes: list[tuple[int, str]] = []
        also: set[int] = set()
        todo, seen = [name], set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            for op, pos in consumers.get(t, ()):
                args = (op.attrs or {}).get("args", ())
                if op.type in PASS and pos in PASS[op.type]:
                    todo += list(op.outputs)
                elif op.type in ALLOWED and len(args) > 1 and isinstance(args[1], int):
                    also.add(args[1])
                elif (size := _indexed_size(graph, op, pos)) is not None:
                    sizes.append((size, op.name))
        if sizes:
            size, op_name = min(sizes)
            out[name] = IndexBound(size, op_name, tuple(sorted(also)))
    return out


def check_index_values(name: str, t: torch.Tensor, bound: IndexBound, where: str = "") -> None:
    """Refuse ``t`` if it holds a value its indexing op cannot take (on the driver, before any worker)."""
    if t.numel() == 0:
        return
    bad = (t < 0) | (t >= bound.size)
    for v in bound.also:
        bad &= t != v
    if bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0])
        also = f" (or {', '.join(map(str, bound.also))}, which the step ignores)" if bound.also else ""
        raise GraphError(f"{where}input {name!r} holds {int(t[at])} at index {at}, but {bound.op!r} indexes a "
                         f"dim of size {bound.size} with it: valid values are 0..{bound.size - 1}{also}")
