"""A captured joint graph at a smaller batch, derived from the one captured at the whole batch instead of
capturing the model again.

Why: the search prices pipelines on the graph of one micro-batch (1/M of the batch), and an ATen capture
of a real model (torch.export and AOTAutograd: GPT-2 small, 2-3 CPU seconds) is the costliest step
of a search that needs it. The graph of a smaller batch is, op for op, the same graph: the same ops with
the same names, where the batch appears only as the leading dim of the inputs and activations and as
sizes the model wrote into its ops (``view(x, (8, 1024, 768))``, ``expand(m, (8, -1))``, ``arange(8)``).

How: every input's leading dim becomes the new batch; in every op's attributes an integer equal to the
old batch becomes the new one, and where that leaves a size a view cannot take, the leading size is
scaled instead (``view(x, (8192, 768))`` of 8 x 1024 tokens); then the registry infers every output
again. A size an output scaled that way (8192 rows) is scaled wherever an attribute names it too, before
or after (a fused cross entropy's backward expands its gradient to ``(8192,)``, and its rule reads the
rows from another input, so nothing downstream would notice a stale size): a first pass collects such
sizes, a second derives with all of them and must collect no more; one also found in a weight's or
constant's shape could mean either, and is not derived. Derived only where each output comes out as it
was or with one dim scaled by exactly new/old,
and every parameter's gradient keeps its shape; anything else (a constant of the batch's size, an input
whose leading dim is not the batch, a size written as a product the rules cannot read) returns None,
and the caller captures the model instead. So does a graph with another dim of the batch's size (a size
in an attribute could then mean either), and a batch of one sample: torch specializes dims of size 1,
so a capture of one sample has other ops (GPT-2's attention mask skips an ``expand``).
``tests/test_search_rebatch.py`` compares derived graphs with direct captures, node for node: the same
but for a float the batch set (``mse_loss``'s 2/B in its backward), which keeps the whole batch's value.
The search reads shapes, never values, of these graphs (prices, deduction, the simulator), and measures
finalists on the model itself.
"""

from __future__ import annotations

from typing import Any

import torch

from ..compiler.ir import Graph
from ..ops.registry import TensorMeta, get_op

VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.expand.default",
         "reshape", "view")  # the ATen ops (the shape is their second argument), sbplab's (attribute ``shape``)


def _swap(v: Any, sizes: dict[int, int]) -> Any:
    """``v`` with every integer (not a bool) that ``sizes`` names replaced, through tuples and lists."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return sizes.get(v, v)
    if isinstance(v, (tuple, list)):
        return type(v)(_swap(x, sizes) for x in v)
    return v


def _lead_scaled(attrs: dict, old: int, new: int) -> dict | None:
    """A view's attributes with the leading size of its shape scaled by new/old (None: it cannot be)."""
    args = attrs.get("args")
    aten = isinstance(args, tuple) and len(args) >= 2
    shape = args[1] if aten else attrs.get("shape")
    if not isinstance(shape, (tuple, list)) or not shape:
        return None
    lead = shape[0]
    if isinstance(lead, bool) or not isinstance(lead, int) or lead <= 0 or (lead * new) % old:
        return None
    size = type(shape)((lead * new // old, *shape[1:]))
    return {**attrs, "args": (args[0], size, *args[2:])} if aten else {**attrs, "shape": size}


def _scaled_dim(before: TensorMeta, after: TensorMeta, old: int, new: int) -> int | None:
    """-1 where ``after`` is ``before``; the dim's old size where ``after`` is ``before`` with one dim scaled
    by new/old (the batch's, leading or moved by a transpose: a weight's gradient reads ``x.t()``); else
    None."""
    if before == after:
        return -1
    b, a = before.shape, after.shape
    if before.dtype != after.dtype or len(a) != len(b):
        return None
    moved = [k for k in range(len(b)) if a[k] != b[k]]
    return b[moved[0]] if len(moved) == 1 and a[moved[0]] * old == b[moved[0]] * new else None


def rebatch(g: Graph, grads: dict[str, str], old: int, new: int) -> Graph | None:
    """A copy of ``g`` (a captured joint graph whose inputs have the batch ``old`` as their leading dim)
    with the batch ``new``, or None where the module docstring's rules cannot derive it."""
    if new == old:
        return g.copy()
    if new < 2 or old % new:  # torch specializes a dim of size 1 (a capture of one sample has other ops)
        return None
    if any(old in t.shape[1:] for t in g.tensors.values()):  # another dim of the batch's size (heads = batch):
        return None  # an attribute equal to it could be either, and the checks below could not tell
    # Sizes that are products of the batch (8 x 1024 rows of a flattened view) are scaled where an op's
    # output shows them, and an attribute naming one (a fused loss's backward expands its gradient to the
    # rows) must be scaled too, wherever it comes in the graph: so a first pass collects them, a second
    # derives with all of them, and the two must agree. A product also found in a weight's or constant's
    # shape could mean either: not derived.
    fixed = {d for t in g.tensors.values() if t.producer is None and t.role != "input" for d in t.shape}
    sizes = {old: new}
    for _ in range(2):
        seen = dict(sizes)
        c = _derive(g, old, new, sizes)
        if c is None or any(s in fixed for s in sizes if s != old):
            return None
        if sizes == seen:
            break
    else:
        return None
    if any(c.tensors[gr].meta != g.tensors[gr].meta for gr in grads.values()):
        return None
    return c


def _derive(g: Graph, old: int, new: int, sizes: dict[int, int]) -> Graph | None:
    """One pass of ``rebatch``: integers in ``sizes`` replaced in every op's attributes; every dim an op's
    output scaled (its old size, its new) added to ``sizes``."""
    c = g.copy()
    for t in c.tensors.values():
        if t.producer is not None:
            continue
        if t.role == "input":
            if not t.shape or t.shape[0] != old:
                return None
            t.meta = TensorMeta((new, *t.shape[1:]), t.meta.dtype)
        elif t.role == "const" and old in t.shape:  # a constant of the batch's size: not derived
            return None
    for op in c.ops:
        d = get_op(op.type)
        metas = [c.tensors[i].meta for i in op.inputs]
        tries = [{k: _swap(v, sizes) for k, v in op.attrs.items()}]
        if op.type in VIEWS:
            lead = _lead_scaled(op.attrs, old, new)
            if lead is not None and lead != tries[0]:
                tries.append(lead)
        for attrs in tries:
            try:
                outs = list(d.infer(metas, attrs))
            except Exception:  # noqa: BLE001 - a size these attributes cannot take: try the next reading
                continue
            dims = [_scaled_dim(c.tensors[o].meta, m, old, new) for o, m in zip(op.outputs, outs)]
            if len(outs) == len(op.outputs) and None not in dims:
                break
        else:
            return None
        for b in dims:
            if b is not None and b != -1:
                a = b * new // old
                if sizes.setdefault(b, a) != a:
                    return None
        op.attrs = attrs
        for o, m in zip(op.outputs, outs):
            c.tensors[o].meta = m
    return c


class Captures:
    """``capture_aten`` for ``trace_training_graph(capture_fn=...)``: the first call captures (the whole
    batch, as the search traces first), a later one at a smaller batch is derived from it (``rebatch``)
    where the rules allow, else captured too. ``derived`` counts the captures saved."""

    def __init__(self) -> None:
        self.whole: tuple[int, Graph, dict[str, str], Any] | None = None  # (batch, raw graph, grads, autocast)
        self.derived = 0

    def __call__(self, model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Any = None,
                 targets: tuple = (), autocast: Any = None) -> tuple[Graph, dict[str, str]]:
        from ..compiler.frontend.aten_capture import capture_aten

        flat = (*args, *kwargs.values(), *targets)
        batch = int(flat[0].shape[0]) if flat and flat[0].dim() else None
        if self.whole is not None and batch is not None and self.whole[3] == autocast:
            old, g, grads, _ = self.whole
            got = rebatch(g, grads, old, batch)
            if got is not None:
                self.derived += 1
                return got, dict(grads)
        g, grads = capture_aten(model, args, kwargs, loss_fn, targets, autocast=autocast)
        if self.whole is None and batch is not None:
            self.whole = (batch, g.copy(), dict(grads), autocast)  # kept unchanged: the caller edits ``g``
        return g, grads
