"""Megatron tensor parallel as a rule over one named mesh axis, found from the graph's structure.

``TensorParallel("tp")`` meets the training graph and splits what Megatron splits:

- column/row pairs (``megatron.find_pairs``): a layer whose weight is split by output features feeds,
  through ops that keep the split without talking (activations, a reshape into heads, attention), a
  layer whose weight is split by input features; one all-reduce forward (g) and one backward (f) per
  pair. Grouped-query attention whose KV heads do not divide the axis keeps K and V whole (replicated,
  read split by slicing) and still splits the query heads; heads that do not divide at all are said.
- the embedding over the vocabulary (VocabParallelEmbedding): each rank looks up the ids in its rows,
  zeros for the rest, a partial sum all-reduced.
- the output layer over the vocabulary: the language-model head whose output features are the
  vocabulary. A captured model's cross entropy is written for vocabulary shards
  (``frontend/vocab_cross_entropy.py``): its logits are never gathered, the row max and the sum of
  exponentials are all-reduced (Megatron's vocab-parallel cross entropy). Elsewhere (the fx path's fused
  ``cross_entropy``) the logits are gathered for the loss (Megatron's ``gather_output``).
- fused QKV layers (one weight for q, k and v, its output cut into them): split per head of each with a
  strided split, ``S(d, chunks=3)`` (``megatron.fused_chunks``).
- ``sequence_parallel``: the row outputs and the embedding are reduce-scattered over the sequence
  (``S(1)`` of ``(B, T, C)``, ``S(0)`` of a flattened ``(B*T, C)``) instead of all-reduced, the norms and
  residual adds between blocks run on sequence shards, and each column layer's input is all-gathered.

Names (``column``/``row`` globs) only nominate candidates; when the default globs name no layer, every
layer with a weight is a candidate and the structure alone decides.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ....sbp import B, S
from ..megatron import CASTS, TRANSPOSES, Pairing, find_pairs, fused_chunks, linear_use, uncast, weight_module
from ..signature_hints import escape
from .base import ParallelRule, RuleUse, on_axis, stage_mesh

if TYPE_CHECKING:
    from ...ir import Graph, OpNode
    from ..strategy import Hint, Strategy

COLUMN = ("*fc1", "*.q", "*.k", "*.v", "*conv1")  # weight (out, in) split by output features
ROW = ("*fc2", "*.proj", "*conv2")  # weight split by input features; output is P
EMBEDDINGS = ("embedding", "aten.embedding.default")  # (ids, weight) and (weight, ids)


@dataclass(frozen=True)
class TensorParallel(ParallelRule):
    """Megatron tensor parallel over mesh axis ``axis`` (see the module docstring).

    ``vocab``: also split the embedding and the output layer over the vocabulary; ``None`` (the presets'):
    only where the loss runs on vocabulary shards, so the logits are never gathered. ``required``: a rule
    that splits nothing in the model is a ``TensorParallelError`` at compile time (False: a
    ``TensorParallelWarning``, what the presets use since their defaults meet every model). User
    ``column``/``row`` globs must each name a layer."""

    axis: str | int = "tp"
    sequence_parallel: bool = False
    column: tuple[str, ...] = COLUMN
    row: tuple[str, ...] = ROW
    vocab: bool | None = True
    required: bool = True

    splits_weights: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "column", tuple(self.column))
        object.__setattr__(self, "row", tuple(self.row))

    @property
    def strict(self) -> bool:
        return self.column != COLUMN or self.row != ROW

    def describe(self) -> str:
        sp = ", sequence_parallel=True" if self.sequence_parallel else ""
        globs = f", column={list(self.column)}, row={list(self.row)}" if self.strict else ""
        return f"TensorParallel({self.axis!r}{sp}{globs})"

    def pairing(self, graph: Graph, tp: int) -> Pairing:
        """The pairs the globs nominate; when the default globs name no layer, the structure alone."""
        found = find_pairs(graph, self.column, self.row, tp)
        if not self.strict and not found.pairs and len(found.unmatched) == len(self.column) + len(self.row):
            return find_pairs(graph, ("*",), ("*",), tp)
        return found

    def check_globs(self, graph: Graph, pairing: Pairing) -> None:
        """User globs naming no layer are an error with close names."""
        from ..strategy import HintError

        if not self.strict or not pairing.unmatched:
            return
        modules = sorted({m for op in graph.ops if (m := weight_module(graph, op))})
        bad = []
        for g in pairing.unmatched:
            close = difflib.get_close_matches(g, modules, n=3, cutoff=0.5)
            bad.append(f"{g!r} (close: {close})" if close else repr(g))
        raise HintError(f"{self.describe()}: {', '.join(bad)} match no layer with a weight; layers are: "
                        f"{', '.join(modules[:20])}{' ...' if len(modules) > 20 else ''}")

    def resolve(self, graph: Graph, strategy: Strategy) -> RuleUse:
        mesh = stage_mesh(strategy)
        a = self.axis_index(mesh)
        tp = mesh.shape[a]
        dp = [ax for r in strategy.rules if type(r).__name__ == "DataParallel" for ax in r.axes(strategy)
              if ax != a]
        ctx = _TPContext(graph, a, mesh.ndim, dp, self.sequence_parallel,
                         {} if graph.input_grads else _backward_matmuls(graph))
        pairing = self.pairing(graph, tp)
        self.check_globs(graph, pairing)
        hints = _pair_hints(ctx, pairing)
        lines, warns = pairing.lines(), []
        embeds, heads = ([], []) if self.vocab is False else _vocab(ctx, pairing, tp)
        if self.vocab is None and not any(ok and _sharded_loss(graph, op.outputs[0]) for _, op, ok, _ in heads):
            embeds, heads = [], []  # the logits would be gathered: the vocabulary stays whole (vocab=True splits it)
        for kind, op, ok, why in embeds + heads:
            logits = ", its logits split by vocabulary into the cross entropy (never gathered)" \
                if _sharded_loss(graph, op.outputs[0]) else ", its logits gathered for the loss"
            done = "split" + (logits + " (the group above is this layer)" if kind == "output layer"
                              else ", its partial lookups summed") if ok else f"kept whole: {why}"
            lines.append(f"{kind} {op.name} over the vocabulary: {done}")
            if not ok and "position table" not in why:
                warns.append(f"{kind} {_module(graph, op)}: {why}")
        hints += _vocab_hints(ctx, [x for x in embeds if x[2]], [x for x in heads if x[2]])
        split_heads = {op.name for _, op, ok, _ in heads if ok}
        for g in pairing.groups:
            if not g.paired and not set(g.columns) <= split_heads:
                warns.append(f"{', '.join(_module(graph, graph.op_by_name[c]) for c in g.columns)}: {g.broken}")
        warns += [f"{_module(graph, graph.op_by_name[c])} kept whole: {why}" for c, why in pairing.kept_whole.items()]
        applied = bool(pairing.pairs) or any(x[2] for x in embeds + heads)
        return RuleUse(hints, lines, warns, applied, pairing)


def _module(graph: Graph, op: OpNode) -> str:
    return weight_module(graph, op) or op.name


@dataclass(frozen=True)
class _TPContext:
    graph: Graph
    axis: int
    ndim: int
    dp: list[int]
    sequence_parallel: bool
    # forward op -> its backward matmuls (captured graphs)
    backward_matmuls: dict[str, list[OpNode]] = field(default_factory=dict, compare=False)

    def nd(self, x: object) -> tuple:
        return on_axis(self.axis, self.ndim, x)

    def whole(self) -> tuple:
        """Whole on the tensor-parallel axis, the batch split on the data-parallel ones."""
        return tuple(S(0) if a in self.dp else B for a in range(self.ndim))

    def last_split(self, name: str) -> tuple:
        """Split by its last dim on the tp axis (logits by vocabulary), the batch on the data-parallel ones."""
        last = len(self.graph.tensors[name].shape) - 1
        return tuple(S(0) if a in self.dp else S(last) if a == self.axis else B for a in range(self.ndim))

    def between_blocks(self, name: str) -> tuple:
        """What an activation between blocks is on the tp axis: whole, or under sequence parallel split by
        the sequence (dim 1 of (B, T, C), dim 0 of a flattened (B*T, C))."""
        if not self.sequence_parallel:
            return self.whole()
        shape = self.graph.tensors[name].shape
        seq = 1 if len(shape) >= 3 else 0
        return tuple(S(0) if a in self.dp else S(seq) if a == self.axis else B for a in range(self.ndim))


def _hint(pattern: str, names: list[str], sbp: object, why: str, out: list[Hint], **kw) -> None:
    from ..strategy import Hint

    # most patterns are one escaped name: matching it needs no regular expression compiled for it
    mine = tuple(n for n in names if pattern == escape(n) or fnmatch.fnmatchcase(n, pattern))
    if mine:
        out.append(Hint(pattern, sbp, why, required=False, only=mine, **kw))


def _pair_hints(ctx: _TPContext, pairing: Pairing) -> list[Hint]:
    """Megatron's hints restricted (``Hint.only``) to the layers of real pairs; patterns are the globs that
    nominated them, so explanations quote them as a user would write them."""
    graph, out = ctx.graph, []
    cols = [graph.op_by_name[c] for g in pairing.pairs for c in g.columns]
    rows = [graph.op_by_name[r] for g in pairing.pairs for r in g.rows]
    col_uses = [(op, linear_use(graph, op)) for op in cols]
    row_uses = [(op, linear_use(graph, op)) for op in rows]
    chunks = {op.name: fused_chunks(graph, op) for op in cols}  # 3: a fused QKV layer, split per head of q, k, v
    fused = " (fused: each rank its heads of every part)"
    for c in pairing.column:
        for dim, k in {(u.param_out, chunks[op.name]) for op, u in col_uses}:  # Linear (out, in), Conv1D (in, out)
            _hint(f"{c}.weight", [u.param for op, u in col_uses if (u.param_out, chunks[op.name]) == (dim, k)],
                  ctx.nd(S(dim, k)), "Megatron column parallel" + (fused if k > 1 else ""), out, role="param",
                  pin=True)
        for k in set(chunks.values()):
            _hint(f"{c}.bias", [uncast(graph, op.inputs[u.bias]) for op, u in col_uses
                                if u.bias is not None and len(op.inputs) > u.bias and chunks[op.name] == k],
                  ctx.nd(S(0, k)), "Megatron column parallel" + (fused if k > 1 else ""), out, role="param")
    for r in pairing.row:
        for dim in (0, 1):
            _hint(f"{r}.weight", [u.param for _, u in row_uses if u.param_in == dim], ctx.nd(S(dim)),
                  "Megatron row parallel", out, role="param", pin=True)
    for uses, dim in ((col_uses, "param_out"), (row_uses, "param_in")):
        for op, u in uses:  # a captured graph reads t(weight) (through casts), its backward t(t(weight)): all split
            k = chunks.get(op.name, 1) if dim == "param_out" else 1
            for w, d in _weight_views(graph, u.param, getattr(u, dim)):
                _hint(escape(w), [w], ctx.nd(S(d, k)), "Megatron: the layer reads its weight split", out, pin=True)
    if not graph.input_grads:  # a captured graph: the column inputs' gradients found from the backward ops
        what = "reduce-scattered" if ctx.sequence_parallel else "all-reduced"
        for g in pairing.pairs:
            for t in _summed_input_grads(ctx, [graph.op_by_name[c] for c in g.columns]):
                _hint(escape(t), [t], ctx.between_blocks(t), f"Megatron f: the input's gradient is {what}", out,
                      role="activation")
    for op, u in col_uses:
        x = op.inputs[u.data]
        if graph.input_grads:  # the fx path's autodiff records each op's input gradients
            what = "reduce-scattered" if ctx.sequence_parallel else "all-reduced"
            _hint(_glob_for(op.name, pairing.column), [op.name], ctx.between_blocks(x),
                  f"Megatron f: the input's gradient is {what}", out, input_grad=u.data)
        if ctx.sequence_parallel:
            _hint(escape(x), [x], ctx.whole(), "sequence parallel: the column input all-gathered", out, use=True)
    for op in rows:
        o = op.outputs[0]
        why = "sequence parallel: the output reduce-scattered over the sequence" if ctx.sequence_parallel \
            else "Megatron g: the output is all-reduced"
        _hint(_glob_for(o, pairing.row), [o], ctx.between_blocks(o), why, out, role="activation")
        g = graph.tensor_grads.get(o)
        if ctx.sequence_parallel and g is not None:  # the backward of the reduce-scatter: an all-gather
            _hint(escape(g), [g], ctx.whole(), "sequence parallel: the output's gradient all-gathered", out, use=True)
    return out


GRAD_PATH = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _backward_matmuls(graph: Graph) -> dict[str, list[OpNode]]:
    """Per forward op, the backward matmuls that differentiate it, in graph order: made once per rule
    resolution (a scan of a 32-layer model's ops per column layer cost a quarter of its deduction)."""
    index: dict[str, list[OpNode]] = {}
    for b in graph.ops:
        if b.forward_op is not None and b.phase == "backward" and b.type in BACKWARD_MATMULS:
            index.setdefault(b.forward_op, []).append(b)
    return index


BACKWARD_MATMULS = ("aten.mm.default", "aten.matmul.default")


def _summed_input_grads(ctx: _TPContext, columns: list[OpNode]) -> list[str]:
    """The gradients of the inputs of ``columns`` (a captured graph's backward matmuls that read the layer's
    weight and make a tensor of its input's shape), followed through reshapes and summed where several
    columns read one input (q, k and v): one tensor per input, the one Megatron's f all-reduces."""
    graph, ends = ctx.graph, []
    for op in columns:
        use = linear_use(graph, op)
        if use is None:
            continue
        views = {use.param, *(w for w, _ in _weight_views(graph, use.param, use.param_out))}
        shape = graph.tensors[op.inputs[use.data]].shape
        for b in ctx.backward_matmuls.get(op.name, ()):
            if views & set(b.inputs) and graph.tensors[b.outputs[0]].shape == shape:
                ends.append(b.outputs[0])
    ends = [_through_views(graph, t) for t in ends]
    changed = True
    while changed and len(ends) > 1:
        changed = False
        for t in ends:
            readers = graph.consumers(t)
            if len(readers) == 1 and readers[0].type == "aten.add.Tensor" and set(readers[0].inputs) <= set(ends):
                ends = [e for e in ends if e not in readers[0].inputs] + [_through_views(graph, readers[0].outputs[0])]
                changed = True
                break
    return ends


def _through_views(graph: Graph, name: str) -> str:
    while len(readers := graph.consumers(name)) == 1 and readers[0].type in GRAD_PATH:
        name = readers[0].outputs[0]
    return name


def _weight_views(graph, param: str, dim: int) -> list[tuple[str, int]]:
    """The tensors made from ``param`` (split on ``dim``) by 2-D transposes and dtype casts alone, with the
    dim each is split on: what a captured matmul reads as the layer's weight, forward and backward."""
    out, todo = [], [(param, dim)]
    while todo:
        name, d = todo.pop()
        for op in graph.consumers(name):
            if len(op.outputs) != 1:
                continue
            if op.type in CASTS:
                out.append((op.outputs[0], d))
            elif op.type in TRANSPOSES and len(graph.tensors[name].shape) == 2:
                out.append((op.outputs[0], 1 - d))
            else:
                continue
            todo.append(out[-1])
    return out


def _glob_for(name: str, globs: tuple[str, ...]) -> str:
    """The glob that nominated ``name`` (so reports quote what a user would write), else the exact name."""
    return next((g for g in globs if fnmatch.fnmatchcase(name, g)), escape(name))


PICK = "sbplab.pick_logit.default"  # the target's logit of the capture's cross entropy (vocab_cross_entropy.py)
LOSS_PATH = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.slice.Tensor",
             "aten._to_copy.default", "aten.clone.default", "aten.alias.default")


def _sharded_loss(graph: Graph, logits: str, depth: int = 8) -> bool:
    """Whether ``logits`` reach a cross entropy written for vocabulary shards (through reshapes, slices and
    casts) and nothing else reads them: then they need never be gathered."""
    todo, seen = [(logits, 0)], False
    while todo:
        name, k = todo.pop()
        for op in graph.consumers(name):
            if op.phase != "forward":
                continue
            if op.type == PICK:
                seen = True
            elif op.type in LOSS_PATH and k < depth:
                todo.append((op.outputs[0], k + 1))
    return seen


def _loss_reductions(graph: Graph) -> list[tuple[str, str]]:
    """The row max and the row sum of exponentials of each sharded cross entropy (the reductions over the
    classes that Megatron all-reduces), as (tensor, what)."""
    out = []
    for pick in [op for op in graph.ops if op.type == PICK and op.phase == "forward"]:
        x = pick.inputs[0]
        for op in graph.consumers(x):
            if op.type == "aten.amax.default":
                out.append((op.outputs[0], "the row max"))
            for e in graph.consumers(op.outputs[0]) if op.type == "aten.sub.Tensor" else ():
                for r in graph.consumers(e.outputs[0]) if e.type == "aten.exp.default" else ():
                    if r.type == "aten.sum.dim_IntList":
                        out.append((r.outputs[0], "the sum of exponentials"))
    return out


def _embedding_parts(op: OpNode) -> tuple[str, str]:
    """(ids, weight) of an embedding op, whatever order its type takes them in."""
    return (op.inputs[0], op.inputs[1]) if op.type == "embedding" else (op.inputs[1], op.inputs[0])


def _from_input(graph: Graph, name: str, depth: int = 6) -> bool:
    """Whether ``name`` is a model input, or one reshaped or cast (token ids, not computed positions)."""
    for _ in range(depth):
        t = graph.tensors[name]
        if t.role == "input":
            return True
        src = graph.producer(name)
        if src is None or not src.inputs:
            return False
        name = src.inputs[0]
    return False


def _vocab(ctx: _TPContext, pairing: Pairing, tp: int) -> tuple[list, list]:
    """Embeddings and language-model heads, each as (kind, op, splits, why not)."""
    graph = ctx.graph
    fwd = [op for op in graph.ops if op.phase == "forward"]
    embeds, vocab_sizes = [], set()
    for op in fwd:
        if op.type not in EMBEDDINGS:
            continue
        ids, w = _embedding_parts(op)
        wt = graph.tensors[w]
        if wt.role != "param" or len(wt.shape) != 2:
            continue
        if _from_input(graph, ids):
            vocab_sizes.add(wt.shape[0])
        if not _from_input(graph, ids):
            embeds.append(("embedding", op, False, "its ids are computed, not the model's input (a position "
                                                  "table, not a vocabulary): it stays whole"))
        elif wt.shape[0] % tp:
            embeds.append(("embedding", op, False, f"its {wt.shape[0]} rows do not divide over {tp} ranks"))
        else:
            embeds.append(("embedding", op, True, ""))
    paired = {c for g in pairing.pairs for c in (*g.columns, *g.rows)}
    whole_tables = {_embedding_parts(op)[1] for _, op, ok, _ in embeds if not ok}
    heads = []
    for op in fwd:
        use = linear_use(graph, op) if op.type not in EMBEDDINGS else None
        if use is None or op.name in paired:
            continue
        p = graph.tensors[use.param]
        if p.shape[use.param_out] not in vocab_sizes:
            continue
        if p.name in whole_tables:
            heads.append(("output layer", op, False, f"its weight is tied to the embedding {p.name}, which stays whole"))
        elif p.shape[use.param_out] % tp:
            heads.append(("output layer", op, False, f"its {p.shape[use.param_out]} outputs do not divide over {tp}"))
        else:
            heads.append(("output layer", op, True, ""))
    return embeds, heads


def _vocab_hints(ctx: _TPContext, embeds: list, heads: list) -> list[Hint]:
    graph, out = ctx.graph, []
    for _, op, _, _ in embeds:
        _, w = _embedding_parts(op)
        _hint(escape(w), [w], ctx.nd(S(0)), "Megatron vocab-parallel embedding: rows split by vocabulary", out,
              role="param", pin=True)
        o = op.outputs[0]
        why = "vocab-parallel embedding: the partial lookups reduce-scattered over the sequence" \
            if ctx.sequence_parallel else "vocab-parallel embedding: the partial lookups all-reduced"
        _hint(escape(o), [o], ctx.between_blocks(o), why, out, role="activation")
        g = ctx.graph.tensor_grads.get(o)
        if ctx.sequence_parallel and g is not None:  # the backward of the reduce-scatter: an all-gather, so
            # each rank computes its rows' gradient from the whole output gradient (no weight-grad reduce)
            _hint(escape(g), [g], ctx.whole(), "sequence parallel: the embedding's output gradient all-gathered",
                  out, use=True)
    for _, op, _, _ in heads:
        use = linear_use(graph, op)
        _hint(escape(use.param), [use.param], ctx.nd(S(use.param_out)), "Megatron output layer: split by vocabulary",
              out, role="param", pin=True)
        o = op.outputs[0]
        if _sharded_loss(graph, o):
            _hint(escape(o), [o], ctx.last_split(o), "Megatron output layer: the logits stay split by vocabulary, "
                  "the cross entropy runs on the shards", out, role="activation")
            for t, why in _loss_reductions(graph):
                _hint(escape(t), [t], ctx.whole(), f"Megatron vocab-parallel cross entropy: {why} all-reduced", out,
                      use=True)
        else:
            _hint(escape(o), [o], ctx.whole(), "Megatron output layer: the logits gathered for the loss", out,
                  role="activation")
        what = "reduce-scattered" if ctx.sequence_parallel else "all-reduced"
        if graph.input_grads:
            _hint(escape(op.name), [op.name], ctx.between_blocks(op.inputs[use.data]),
                  f"Megatron f: the input's gradient is {what}", out, input_grad=use.data)
        for t in [] if graph.input_grads else _summed_input_grads(ctx, [op]):
            _hint(escape(t), [t], ctx.between_blocks(t), f"Megatron f: the input's gradient is {what}", out,
                  role="activation")
        x = op.inputs[use.data]
        if ctx.sequence_parallel:  # a column layer: its input gathered for use, forward and for the weight grad
            _hint(escape(x), [x], ctx.whole(), "sequence parallel: the output layer's input all-gathered", out,
                  use=True)
    return out
