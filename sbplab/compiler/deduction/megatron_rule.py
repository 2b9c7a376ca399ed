"""A preset's Megatron request, turned into exact tensor hints once the graph is known.

Presets are built before any model is seen, so they cannot name tensors; they carry a
``MegatronRule`` (which globs nominate column and row layers, which mesh axis is the tensor-parallel
one) and deduction asks it for hints when it meets the graph. The rule finds the real pairs
(``megatron.find_pairs``) and hints only those: column weights ``S(0)``, row weights ``S(1)``, the
row output all-reduced (Megatron's g) and the column input's gradient all-reduced (Megatron's f).
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass

from ...sbp import B, S
from ..ir import Graph
from .megatron import Pairing, find_pairs, linear_use, weight_module
from .strategy import Hint, HintError


@dataclass(frozen=True)
class MegatronRule:
    """Megatron tensor parallelism on mesh axis ``axis`` of an ``ndim``-D mesh.

    ``column``/``row`` are globs over module paths of weights; ``dp_axis`` is the mesh axis the
    batch is split on (activations stay ``S(0)`` there). ``strict``: a glob naming no layer is an
    error (the user wrote it); the default globs cover several model families and may miss.
    """

    axis: int
    ndim: int
    column: tuple[str, ...]
    row: tuple[str, ...]
    dp_axis: int | None = None
    strict: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.axis < self.ndim:
            raise ValueError(f"MegatronRule.axis must be a mesh axis in [0, {self.ndim}), got {self.axis}")
        if self.dp_axis is not None and not (0 <= self.dp_axis < self.ndim and self.dp_axis != self.axis):
            raise ValueError(f"MegatronRule.dp_axis must be another mesh axis in [0, {self.ndim}), got {self.dp_axis}")

    def describe(self) -> str:
        return (f"Megatron rule on mesh axis {self.axis}: column layers {list(self.column)}, "
                f"row layers {list(self.row)}")

    def pairing(self, graph: Graph, tp_size: int) -> Pairing:
        """The pairs the globs nominate; when a preset's default globs name no layer at all (a model
        with other names, a captured transformers model), every layer with a weight is a candidate and
        the graph's structure alone decides: a column is any such layer whose input is not split, a row
        any such layer that reads a column's split on its contracted dim."""
        found = find_pairs(graph, self.column, self.row, tp_size)
        if not self.strict and not found.pairs and len(found.unmatched) == len(self.column) + len(self.row):
            return find_pairs(graph, ("*",), ("*",), tp_size)
        return found

    def check(self, graph: Graph, pairing: Pairing) -> None:
        """A strict rule whose globs name no layer is an error with close names."""
        if not self.strict or not pairing.unmatched:
            return
        modules = sorted({m for op in graph.ops if (m := weight_module(graph, op))})
        bad = []
        for g in pairing.unmatched:
            close = difflib.get_close_matches(g, modules, n=3, cutoff=0.5)
            bad.append(f"{g!r} (close: {close})" if close else repr(g))
        raise HintError(f"{self.describe()}: {', '.join(bad)} match no layer with a weight; layers are: "
                        f"{', '.join(modules[:20])}{' ...' if len(modules) > 20 else ''}")

    def hints(self, graph: Graph, pairing: Pairing) -> list[Hint]:
        """The hints Megatron needs, restricted (``Hint.only``) to the layers of real pairs.

        Patterns and reasons are the rule's globs and Megatron's words, so explanations quote them as a
        user would write them; ``only`` keeps each hint off layers the graph does not let pair.
        """
        def nd(x) -> tuple:
            return tuple(x if a == self.axis else B for a in range(self.ndim))

        whole = tuple(S(0) if a == self.dp_axis else B for a in range(self.ndim))  # batch split on dp only
        cols = [graph.op_by_name[c] for g in pairing.pairs for c in g.columns]
        rows = [graph.op_by_name[r] for g in pairing.pairs for r in g.rows]
        out: list[Hint] = []

        def add(pattern: str, names: list[str], sbp, why: str, **kw) -> None:
            mine = tuple(n for n in names if fnmatch.fnmatchcase(n, pattern))
            if mine:
                out.append(Hint(pattern, sbp, why, required=False, only=mine, **kw))

        col_uses = [(op, linear_use(graph, op)) for op in cols]
        row_uses = [(op, linear_use(graph, op)) for op in rows]
        for c in pairing.column:
            for dim in (0, 1):  # an nn.Linear's weight is (out, in), a Conv1D's (in, out)
                add(f"{c}.weight", [u.param for _, u in col_uses if u.param_out == dim], nd(S(dim)),
                    "Megatron column parallel", role="param", pin=True)
            add(f"{c}.bias", [op.inputs[u.bias] for op, u in col_uses if u.bias is not None and len(op.inputs) > u.bias],
                nd(S(0)), "Megatron column parallel", role="param")
            if graph.input_grads:  # the fx path's autodiff records each op's input gradients
                add(c, [op.name for op in cols], whole, "Megatron f: the input's gradient is all-reduced", input_grad=0)
        for r in pairing.row:
            for dim in (0, 1):
                add(f"{r}.weight", [u.param for _, u in row_uses if u.param_in == dim], nd(S(dim)),
                    "Megatron row parallel", role="param", pin=True)
            add(r, [op.outputs[0] for op in rows], whole, "Megatron g: the output is all-reduced", role="activation")
        return out
