"""Megatron pairs found from the graph, not from names alone.

A column-parallel layer (weight split by output features) leaves its output split; a row-parallel
layer (weight split by input features) takes that split input and makes a partial sum, which one
all-reduce finishes. That is only right if every op in between keeps the split without talking:
an elementwise activation does, a LayerNorm over the split dim, a softmax over it or a residual add
with the unsplit stream do not. Names (``*fc1``, ``*.q``) only nominate candidates; the op
registry's signatures decide: an op keeps the pair when it has a signature taking its split inputs
as they are (``S(d)``), every other input ``B``, and making only split outputs. Attention passes
(a reshape to heads, a transpose, a batched matmul of two split tensors, a softmax over an unsplit
dim) because each of those signatures exists; a LayerNorm over the split features does not.

Candidates joined by split tensors form one group (``q``, ``k``, ``v`` and ``proj`` of one attention
layer). A group is paired only if all of it holds; otherwise every layer in it stays replicated and
the group says why (which op, which input, which signatures it does have).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...freeze import freeze_attrs
from ...ops.registry import FORGETTERS, NdSignature, nd_signatures
from ...placement import Placement
from ...sbp import B, Partial, Split
from ..ir import Graph, OpNode
from .caches import Memo


@dataclass
class PairGroup:
    """Column layers, the ops their split flows through, and the row layers it ends in.

    ``broken`` is None for a Megatron pair; otherwise it says why the group stays replicated.
    """

    columns: list[str]  # op names of column-parallel candidates (weight S(0))
    rows: list[str] = field(default_factory=list)  # op names of row-parallel layers the split reaches
    path: list[tuple[str, str, str]] = field(default_factory=list)  # (op, type, 1-D signature) in between
    broken: str | None = None
    culprits: set[str] = field(default_factory=set)  # the columns whose split reached the op that broke it
    heads: bool = False  # broken by a reshape into heads that do not divide the tensor-parallel degree

    @property
    def paired(self) -> bool:
        return self.broken is None and bool(self.rows)

    def describe(self) -> str:
        cols, rows = ", ".join(self.columns), ", ".join(self.rows) or "nothing"
        via = " -> ".join(f"{op} ({t}: {s})" for op, t, s in self.path)
        head = f"[{cols}] -> " + (f"{via} -> " if via else "") + f"[{rows}]"
        if self.paired:
            return f"paired {head}: every op in between keeps the split, one all-reduce each way"
        return f"not paired {head}: {self.broken}; these layers stay replicated"


@dataclass
class Pairing:
    """What a tensor-parallel rule found in one graph: groups, and row candidates no column reaches."""

    groups: list[PairGroup]
    lonely_rows: dict[str, str]  # row candidate op -> why it has no column partner
    unmatched: list[str]  # column/row globs that named no layer
    column: tuple[str, ...] = ()  # the globs that nominated the candidates
    row: tuple[str, ...] = ()
    kept_whole: dict[str, str] = field(default_factory=dict)  # column op -> why it stays whole so its group pairs

    @property
    def pairs(self) -> list[PairGroup]:
        return [g for g in self.groups if g.paired]

    def lines(self) -> list[str]:
        out = [g.describe() for g in self.groups]
        out += [f"column candidate {c} kept whole (replicated over the tensor-parallel axis) so that its group "
                f"pairs: {why}" for c, why in self.kept_whole.items()]
        out += [f"row candidate {r} left replicated: {why}" for r, why in self.lonely_rows.items()]
        return out


@dataclass(frozen=True)
class LinearUse:
    """How a layer's op reads its weight: which input is the activation, which the weight as the op
    reads it (``w_out``: its output-features dim, ``w_in``: its contracted dim), the parameter behind it
    and the parameter's own dims for the same two roles (a column layer stores it split on
    ``param_out``, a row layer on ``param_in``).

    sbplab's ``linear(x, w (out, in), b)`` reads the parameter as it is. A captured ``aten.mm`` or
    ``aten.addmm`` reads ``t(w)`` for an nn.Linear (the parameter is transposed) and the parameter
    itself for GPT-2's Conv1D (stored (in, out)).
    """

    data: int
    weight: int
    bias: int | None
    param: str
    w_out: int
    w_in: int
    param_out: int
    param_in: int

    @property
    def module(self) -> str:
        return self.param[: -len(".weight")] if self.param.endswith(".weight") else self.param


ATEN_MATMUL = {"aten.mm.default": (0, 1, None), "aten.addmm.default": (1, 2, 0)}  # (data, weight, bias) inputs
TRANSPOSES = ("aten.t.default", "aten.transpose.int", "aten.permute.default")
CASTS = ("aten._to_copy.default", "prims.convert_element_type.default", "aten.to.dtype")


def linear_use(graph: Graph, op: OpNode) -> LinearUse | None:
    """``op`` as a layer with a parameter weight, or None."""
    if op.phase != "forward" or len(op.inputs) < 2:
        return None
    if op.type in ATEN_MATMUL:
        data, weight, bias = ATEN_MATMUL[op.type]
        param, transposed = _weight_source(graph, op.inputs[weight])
        if param.role != "param" or len(param.shape) != 2:
            return None
        p_out, p_in = (0, 1) if transposed else (1, 0)
        return LinearUse(data, weight, bias, param.name, 1, 0, p_out, p_in)
    if op.type.startswith("aten."):  # a captured op other than mm/addmm is no layer (a norm, an embedding)
        return None
    w = graph.tensors[op.inputs[1]]
    if w.role != "param" or not w.name.endswith(".weight"):
        return None
    return LinearUse(0, 1, 2 if len(op.inputs) > 2 else None, w.name, 0, 1, 0, 1)


def _weight_source(graph: Graph, w: str):
    """The tensor a matmul's weight operand ``w`` comes from, looking through dtype casts (autocast's
    bf16 copy of an fp32 master weight) and one 2-D transpose; and whether it was transposed."""
    transposed = False
    while (src := graph.producer(w)) is not None:
        if src.type in CASTS:
            w = src.inputs[0]
        elif src.type in TRANSPOSES and not transposed and len(graph.tensors[w].shape) == 2:
            w, transposed = src.inputs[0], True
        else:
            break
    return graph.tensors[w], transposed


def uncast(graph: Graph, name: str) -> str:
    """The tensor ``name`` is a dtype cast of (a bias's fp32 master under autocast), else ``name``."""
    while (src := graph.producer(name)) is not None and src.type in CASTS:
        name = src.inputs[0]
    return name


def weight_module(graph: Graph, op: OpNode) -> str | None:
    """The module path of ``op``'s weight (``blocks.0.fc1`` for ``blocks.0.fc1.weight``), if it has one."""
    use = linear_use(graph, op)
    return use.module if use is not None else None


def _matches(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def _column_split(graph: Graph, op: OpNode, mesh: Placement) -> Split | None:
    """The split of the output when the weight is split by output features and the data ``B`` (strided,
    ``S(d, chunks=k)``, for a fused layer whose output is cut into k parts: ``fused_chunks``)."""
    use = linear_use(graph, op)
    k = fused_chunks(graph, op)
    for sig in _sigs(graph, op, mesh):
        ins, (out, *_) = [x[0] for x in sig.inputs], [x[0] for x in sig.outputs]
        if (ins[use.data] == B and ins[use.weight] == Split(use.w_out, k) and isinstance(out, Split)
                and out.chunks == k and len(sig.outputs) == 1):
            return out
    return None


SPLITS = ("aten.split.Tensor", "aten.split_with_sizes.default")
FUSED_PATH = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.add.Tensor",
              "aten._to_copy.default", "aten.clone.default")


def fused_chunks(graph: Graph, op: OpNode, depth: int = 4) -> int:
    """k when ``op``'s output (a fused QKV layer's: (..., 3C)) reaches, through reshapes that keep its
    features whole, a bias add or a cast, a split of those features into k equal parts (q, k and v)
    with k a chunk count the rules lift (``ops.chunked.CHUNKS``); else 1."""
    from ...ops.aten._common import arg, norm_dim
    from ...ops.aten.family_shape import equal_parts, split_sizes

    name = op.outputs[0]
    n = graph.tensors[name].shape[-1]
    for _ in range(depth):
        readers = [r for r in graph.consumers(name) if r.phase == "forward"]
        if len(readers) != 1:
            return 1
        r = readers[0]
        shape = graph.tensors[r.inputs[0]].shape
        if r.type in SPLITS and r.inputs[0] == name:
            dim = norm_dim(arg(r.attrs, 2, "dim", 0), len(shape))
            if dim == len(shape) - 1 and shape[dim] == n:
                return equal_parts(n, split_sizes(r.type, n, r.attrs)) or 1
            return 1
        if r.type not in FUSED_PATH or graph.tensors[r.outputs[0]].shape[-1] != n:
            return 1
        name = r.outputs[0]
    return 1


def _row_accepts(graph: Graph, op: OpNode, split: Split, mesh: Placement) -> bool:
    """Whether the data split as ``split`` and the weight split on its contracted dim make a partial sum."""
    use = linear_use(graph, op)
    for sig in _sigs(graph, op, mesh):
        ins, outs = [x[0] for x in sig.inputs], [x[0] for x in sig.outputs]
        if ins[use.data] == split and ins[use.weight] == Split(use.w_in) and all(isinstance(o, Partial) for o in outs):
            return True
    return False


def one_d(sig: NdSignature) -> str:
    """A signature on a 1-D mesh as its 1-D text: ``S(1), B -> S(1)``."""
    return f"{', '.join(repr(x[0]) for x in sig.inputs)} -> {', '.join(repr(x[0]) for x in sig.outputs)}"


# Each layer of a deep stack asks the same questions of the same ops (two passes for grouped-query
# attention): answers by the op's type, input shapes, attributes and mesh, bounded like deduction's caches.
_SIGS = Memo("tensor-parallel signatures", 4096)
_KEEPS = Memo("split-keeping signatures", 8192)
FORGETTERS.extend([_SIGS.clear, _KEEPS.clear])  # a rule registered from user code changes them


def _question(graph: Graph, op: OpNode, mesh: Placement) -> tuple:
    return (op.type, tuple([graph.tensors[t].meta for t in op.inputs]), freeze_attrs(op.attrs), mesh.shape)


def _sigs(graph: Graph, op: OpNode, mesh: Placement, question: tuple | None = None) -> tuple[NdSignature, ...]:
    key = question or _question(graph, op, mesh)
    got = _SIGS.get(key)
    if got is None:
        got = _SIGS.put(key, tuple(nd_signatures(op.type, list(key[1]), op.attrs, mesh)))
    return got


def _keeping_signature(graph: Graph, op: OpNode, split: dict[str, int], mesh: Placement,
                       sliceable: frozenset[str] | set[str] = frozenset()) -> NdSignature | None:
    """A signature reading split inputs as they are and the rest ``B``, with only split outputs. An input
    in ``sliceable`` (whole on every rank: a replicated KV head's tensor) may also be read split, since
    taking a slice of a whole tensor costs nothing."""
    want = tuple((split[t],) if t in split else (B,) for t in op.inputs)
    question = _question(graph, op, mesh)
    key = (question, want, tuple([t in sliceable for t in op.inputs]))
    got = _KEEPS.get(key)
    if got is None:
        got = _KEEPS.put(key, (_keeping(op, _sigs(graph, op, mesh, question), want, sliceable),))
    return got[0]


def _keeping(op: OpNode, sigs: tuple[NdSignature, ...], want: tuple, sliceable: frozenset[str] | set[str]
             ) -> NdSignature | None:
    for sig in sigs:
        if not all(isinstance(o[0], Split) for o in sig.outputs):
            continue
        if sig.inputs == want or all(got == w or (t in sliceable and isinstance(got[0], Split))
                                     for t, got, w in zip(op.inputs, sig.inputs, want)):
            return sig
    return None


RESHAPES = ("view", "reshape", "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _no_keep_reason(graph: Graph, op: OpNode, split: dict[str, int], mesh: Placement) -> str:
    have = ", ".join(f"{t} {split[t]!r}" if t in split else f"{t} B" for t in op.inputs)
    valid = [one_d(s) for s in _sigs(graph, op, mesh)][:6]
    heads = _heads_reason(graph, op, split, mesh.size)
    return (f"{op.type} {op.name!r} cannot keep the split without communication: "
            + (f"{heads}; " if heads else "")
            + f"no signature reads {have} and makes split outputs (it has: {'; '.join(valid)})")


def _heads_reason(graph: Graph, op: OpNode, split: dict[str, int], tp: int) -> str | None:
    """A reshape of split features into (heads, head_dim) whose heads do not divide ``tp``: said in words."""
    if op.type not in RESHAPES or op.inputs[0] not in split:
        return None
    if split[op.inputs[0]].chunks > 1:
        return None
    d = split[op.inputs[0]].dim
    shape_in, shape_out = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    if len(shape_out) <= len(shape_in) or tuple(shape_out[:d]) != tuple(shape_in[:d]):
        return None
    heads = shape_out[d]
    if heads % tp == 0:
        return None
    return (f"it reshapes the {shape_in[d]} split features into {heads} x {shape_out[d + 1]} (attention heads x "
            f"head dim) and {heads} heads do not divide over {tp} tensor-parallel ranks")


class _Groups:
    """Union-find over column candidates; each root holds one PairGroup."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.group: dict[int, PairGroup] = {}

    def new(self, column: str) -> int:
        i = len(self.parent)
        self.parent[i], self.group[i] = i, PairGroup([column])
        return i

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, ids: Sequence[int]) -> int:
        roots = sorted({self.find(i) for i in ids})
        keep = self.group[roots[0]]
        for r in roots[1:]:
            g = self.group.pop(r)
            self.parent[r] = roots[0]
            keep.columns += g.columns
            keep.rows += g.rows
            keep.path += g.path
            keep.broken = keep.broken or g.broken
            keep.culprits |= g.culprits
            keep.heads = keep.heads or g.heads
        return roots[0]


def find_pairs(graph: Graph, column: Sequence[str], row: Sequence[str], tp_size: int) -> Pairing:
    """Megatron groups of ``graph`` on a tensor-parallel axis of ``tp_size`` ranks (see module docstring).

    Columns whose split meets a reshape into heads that do not divide ``tp_size`` (grouped-query
    attention's K and V projections with fewer KV heads than ranks) are tried again kept whole: their
    tensors are then read split by slicing, which costs nothing, so the query heads and the output
    projection can still pair (Megatron replicates KV heads likewise). ``Pairing.kept_whole`` says which
    columns and why; when the query heads do not divide either, nothing of the attention pairs."""
    kept: dict[str, str] = {}
    while True:
        found = _find_pairs(graph, column, row, tp_size, frozenset(kept))
        more = {c: g.broken for g in found.groups if g.heads for c in sorted(g.culprits - set(kept))}
        if not more:
            found.kept_whole = kept
            return found
        kept.update(more)


def _find_pairs(graph: Graph, column: Sequence[str], row: Sequence[str], tp_size: int,
                whole: frozenset[str]) -> Pairing:
    mesh = Placement("cpu", tp_size)
    fwd = [op for op in graph.ops if op.phase == "forward"]
    modules = {op.name: weight_module(graph, op) for op in fwd}
    unmatched = [g for g in (*column, *row) if not any(m and fnmatch.fnmatchcase(m, g) for m in modules.values())]
    if len(unmatched) == len(column) + len(row):  # no layer named (the default globs on a model of other names):
        return Pairing([], {}, unmatched, tuple(column), tuple(row))  # nothing to walk, nothing found
    is_row = {op.name for op in fwd if modules[op.name] and _matches(modules[op.name], row)}
    groups = _Groups()
    split: dict[str, Split] = {}  # tensor -> its split, while it flows from a column layer
    owner: dict[str, int] = {}  # tensor -> group id
    origin: dict[str, frozenset[str]] = {}  # tensor -> the column ops whose split it carries
    sliceable: set[str] = set()  # whole tensors computed only from columns kept whole: read split for free
    too_small: list[str] = []
    for op in fwd:
        mine = [t for t in op.inputs if t in split]
        if not mine:
            if op.name in whole:
                sliceable.update(op.outputs)
            elif modules[op.name] and _matches(modules[op.name], column):
                dim = _column_split(graph, op, mesh)
                if dim is None:
                    too_small.append(op.name)
                    continue
                gid = groups.new(op.name)
                split[op.outputs[0]], owner[op.outputs[0]] = dim, gid  # type: ignore[assignment]
                origin[op.outputs[0]] = frozenset({op.name})
            elif any(t in sliceable for t in op.inputs) and not linear_use(graph, op):
                sliceable.update(op.outputs)
            continue
        gid = groups.union([owner[t] for t in mine])
        g = groups.group[gid]
        came = frozenset().union(*(origin[t] for t in mine))
        use = linear_use(graph, op) if op.name in is_row else None
        if use is not None and mine == [op.inputs[use.data]]:
            if _row_accepts(graph, op, split[op.inputs[use.data]], mesh):
                g.rows.append(op.name)
            else:
                g.broken = g.broken or (f"row layer {op.name!r} cannot take its input split "
                                        f"{split[op.inputs[use.data]]!r} with its weight split by input features")
                g.culprits |= came
            continue
        sig = _keeping_signature(graph, op, split, mesh, sliceable)
        if sig is None:
            if g.broken is None:
                g.broken = _no_keep_reason(graph, op, split, mesh)
                g.heads = _heads_reason(graph, op, split, tp_size) is not None
            g.culprits |= came
            continue
        g.path.append((op.name, op.type, one_d(sig)))
        for o, s in zip(op.outputs, sig.outputs):
            split[o], owner[o], origin[o] = s[0], gid, came
    for t, gid in owner.items():
        g = groups.group[groups.find(gid)]
        readers = graph.consumers(t)
        saved = readers and all(c.phase == "backward" for c in readers)  # kept for backward (attention's lse)
        if not any(c.phase == "forward" for c in readers) and not saved and g.broken is None:
            g.broken = f"the split tensor {t!r} leaves the model (nothing downstream reduces it)"
    found = list(groups.group.values())
    for g in found:
        if not g.rows and g.broken is None:
            g.broken = "the split never reaches a row-parallel layer"
    reached = {r for g in found for r in g.rows}
    lonely = {r: _lonely_reason(graph, graph.op_by_name[r], owner, groups) for r in sorted(is_row - reached)}
    for c in too_small:
        found.append(PairGroup([c], broken=f"its output cannot be split over {tp_size} ranks"))
    return Pairing(found, lonely, unmatched, tuple(column), tuple(row))


def _lonely_reason(graph: Graph, op: OpNode, owner: dict[str, int], groups: _Groups) -> str:
    x = op.inputs[linear_use(graph, op).data]
    src = graph.producer(x)
    if x in owner:
        return f"its split input comes from a group that is not paired ({groups.group[groups.find(owner[x])].broken})"
    what = f"{src.type} {src.name!r}" if src is not None else f"the source {x!r}"
    return f"its input comes from {what}, which is not split by a column-parallel layer"
