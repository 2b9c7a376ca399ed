"""Network layers: normalisations, attention, embedding, convolution and pooling, the fused cross entropy,
forward and backward.

Each splits the dims its math keeps independent: a layer norm's leading (batch, sequence) dims,
attention's batch and heads, a convolution's batch or output channels, an embedding's lookups or its
feature dim. The gradient of a replicated weight from split activations comes out partial (P), which
is what makes data parallel's all-reduce appear by signature rather than by special case.
"""

from __future__ import annotations

from ..registry import LocalContext, Signature, TensorMeta
from ._common import B, P, S, arg, sig, with_arg


def layer_norm_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    # native_layer_norm(x, normalized_shape, weight?, bias?) -> (out, mean, rstd)
    x = ins[0].shape
    lead = len(x) - len(arg(attrs, 1, "normalized_shape"))
    return [sig([S(d)] + [B] * (len(ins) - 1), [S(d)] * len(outs)) for d in range(lead) if x[d] > 1]


def layer_norm_backward_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    # (grad, x, normalized_shape, mean, rstd, weight?, bias?, mask) -> (gx, gw, gb); mean, rstd: inputs 2, 3
    x = ins[1].shape
    lead = len(x) - len(arg(attrs, 2, "normalized_shape"))
    return [sig([S(d)] * 4 + [B] * (len(ins) - 4), [S(d), P, P][: len(outs)]) for d in range(lead) if x[d] > 1]


def attention_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """SDPA (any backend, forward or backward): batch (0) and heads (1) split on q, k, v, the output
    and their gradients alike; a mask splits where it has that dim, else stays B. Grouped-query
    attention (fewer k/v heads) splits heads when both counts split into the same pieces (the
    registry's local-shape check)."""
    n = ins[0].shape[0] if ins[0].shape else 1

    def split(m: TensorMeta, d: int) -> object:
        return S(d) if len(m.shape) >= 3 and m.shape[d] > 1 and (d == 1 or m.shape[0] == n) else B

    return [sig([split(m, d) for m in ins], [split(m, d) for m in outs]) for d in (0, 1) if ins[0].shape[d] > 1]


def _mask_split(mask: TensorMeta, d: int, size: int) -> object:
    """An attention mask broadcasts to (B, H, L, S) from the right: it splits batch (d=0) or heads (d=1)
    where it has that dim at full size, else every rank needs all of it."""
    k = len(mask.shape) - 4 + d
    return S(k) if k >= 0 and mask.shape[k] == size else B


def fused_attention_signatures(ins: list[TensorMeta], outs: list[TensorMeta], backward: bool) -> list[Signature]:
    """sbplab's attention op (attention.py). Forward (q, k, v[, mask]) -> (out, lse); backward
    (grad, q, k, v[, mask], out, lse) -> (gq, gk, gv). Batch (0) or heads (1) split on every
    (B, H, ...) tensor; a single key/value head (multi-query attention) stays whole when heads split,
    and then its gradient, summed over the rank's query heads, is partial (P)."""
    q = ins[1 if backward else 0].shape
    kv = ins[2 if backward else 1].shape
    has_mask = len(ins) == (7 if backward else 4)
    mask_at = (4 if backward else 3) if has_mask else -1
    sigs = []
    for d in (0, 1):
        if q[d] <= 1:
            continue
        kv_sbp = S(d) if kv[d] > 1 else B
        ins_s = [_mask_split(m, d, q[d]) if j == mask_at else (kv_sbp if j in ((2, 3) if backward else (1, 2)) else S(d))
                 for j, m in enumerate(ins)]
        outs_s = [S(d), P if kv_sbp is B else S(d), P if kv_sbp is B else S(d)] if backward else [S(d), S(d)]
        sigs.append(sig(ins_s, outs_s))
    return sigs


def embedding_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    # embedding(weight (V, C), indices (...)) -> (..., C)
    idx = ins[1].shape
    sigs = [sig([B, S(d)], [S(d)]) for d in range(len(idx)) if idx[d] > 1]
    # vocabulary parallel: each rank looks up the ids in its rows, zeros elsewhere (vocab_parallel.py)
    return sigs + [sig([S(1), B], [S(len(idx))]), sig([P, B], [P]), sig([S(0), B], [P])]


def embedding_backward_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict | None = None) -> list[Signature]:
    # embedding_dense_backward(grad (..., C), indices (...), num_weights, ...) -> (V, C)
    idx = ins[1].shape
    sigs = [sig([S(d), S(d)], [P]) for d in range(len(idx)) if idx[d] > 1]
    # each rank makes the gradient of its vocabulary rows (vocab_parallel.py)
    sigs += [sig([S(len(idx)), B], [S(1)]), sig([P, B], [P])]
    by_freq = attrs is not None and arg(attrs, 4, "scale_grad_by_freq", False)  # counts need every row's ids
    return sigs if by_freq else sigs + [sig([B, B], [S(0)])]


def conv_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    # convolution(x (N, Cin, ...), w (Cout, Cin/g, ...), bias?, stride, padding, dilation, transposed, ...)
    groups = arg(attrs, 8, "groups", 1)
    transposed = arg(attrs, 6, "transposed", False)
    bias = len(ins) == 3
    sigs = [sig([S(0), B] + [B] * bias, [S(0)])]
    if groups == 1 and not transposed:
        sigs += [sig([B, S(0)] + [S(0)] * bias, [S(1)]), sig([S(1), S(1)] + [P] * bias, [P])]
    return sigs + [sig([P, B] + [P] * bias, [P])]


def conv_backward_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    # convolution_backward(grad, x, w, bias_sizes, ..., groups, mask) -> (gx, gw, gb)
    groups = arg(attrs, 9, "groups", 1)
    transposed = arg(attrs, 7, "transposed", False)
    sigs = [sig([S(0), S(0), B], [S(0), P, P])]
    if groups == 1 and not transposed:
        sigs.append(sig([S(1), B, S(0)], [P, S(0), S(0)]))
        sigs.append(sig([B, S(1), S(1)], [S(1), S(1), B]))  # row parallel: input channels split
    return sigs


def conv_backward_localize(attrs: dict, ctx: LocalContext) -> dict:
    """``bias_sizes`` (argument 3) is the bias's shape: a shard of the output channels has its own."""
    if arg(attrs, 3, "bias_sizes") is None:
        return attrs
    lo, hi = ctx.in_blocks[0][1]  # the output gradient's channels (N, Cout, ...)
    return with_arg(attrs, 3, "bias_sizes", (hi - lo,))


def channels_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """Pooling and other per-(sample, channel) ops on (N, C, ...): split N or C on every (N, C, ...)
    input and output alike."""
    nd = len(ins[0].shape)
    return [sig([S(d) if len(m.shape) == nd else B for m in ins], [S(d) if len(o.shape) == nd else B for o in outs])
            for d in (0, 1) if nd >= 3 and ins[0].shape[d] > 1]


def gather_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict,
                      gather: bool = False) -> list[Signature]:
    """gather / scatter (x, dim, index[, src]): split a dim other than ``dim`` where every input has the
    size x has (then each rank's rows of x, index and src are the same rows). A gather also splits
    its index along ``dim``, x whole: each output element reads x at its own other coordinates, so
    only the gathered dim may lose its position."""
    x = ins[0].shape
    dim = arg(attrs, 1, "dim") % len(x)
    sigs = [sig([S(d)] * len(ins), [S(d)]) for d in range(len(x))
            if d != dim and x[d] > 1 and all(len(m.shape) == len(x) and m.shape[d] == x[d] for m in ins)]
    if gather and ins[1].shape[dim] > 1:
        sigs.append(sig([B, S(dim)], [S(dim)]))
    return sigs


def _one_index(attrs: dict, n_ins: int) -> int | None:
    """Where the single index tensor of ``x[..., idx, ...]`` sits in the indices list (the rest None),
    or None when there are several."""
    slots = [k for k, t in enumerate(arg(attrs, 1, "indices")) if t is not None]
    return slots[0] if len(slots) == 1 and n_ins >= 2 else None


def index_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    """index.Tensor ``x[..., i0, i1, ...]`` with index tensors at adjacent positions p..q (their
    broadcast shape replaces those dims): a dim of x not indexed splits as the output dim it becomes,
    the indices whole; an index tensor splits a dim the others broadcast into (size 1 or missing),
    as the output dim it becomes, x whole; x partial passes (a selection is linear)."""
    x, n = ins[0].shape, len(ins)
    sigs = [sig([P] + [B] * (n - 1), [P])]
    where = [(k, t.index) for k, t in enumerate(arg(attrs, 1, "indices")) if t is not None]
    pos = [k for k, _ in where]
    if not where or pos != list(range(pos[0], pos[0] + len(pos))):
        return sigs  # apart, torch moves the broadcast dims to the front
    p, r = pos[0], max(len(ins[i].shape) for _, i in where)
    sigs += [sig([S(d)] + [B] * (n - 1), [S(d if d < p else d - len(pos) + r)])
             for d in range(len(x)) if d not in pos and x[d] > 1]
    for _, i in where:
        m = ins[i].shape
        for j in range(len(m)):
            b = r - len(m) + j  # the broadcast dim
            others = [ins[o].shape for _, o in where if o != i]
            if m[j] > 1 and all(len(o) - r + b < 0 or o[len(o) - r + b] == 1 for o in others):
                sigs.append(sig([S(j) if k == i else B for k in range(n)], [S(p + b)]))
    return sigs


def index_put_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    """index_put(x, (idx,), values[, accumulate]) with one index tensor at position p: a dim of x
    other than p splits with the values' dim it meets (or whole values where they broadcast), the
    index whole; x and values partial together pass (written or added, the sums agree)."""
    x, p = ins[0].shape, _one_index(attrs, len(ins))
    sigs = [sig([P, B, P], [P])] if len(ins) == 3 else []
    if p is None or len(ins) != 3:
        return sigs
    k, v = len(ins[1].shape), ins[2].shape
    put = len(x) - 1 + k  # the rank of x[idx], which values broadcast to
    for d in range(len(x)):
        if d == p or x[d] <= 1:
            continue
        j = len(v) - put + (d if d < p else d - 1 + k)
        if j < 0 or v[j] == 1:
            sigs.append(sig([S(d), B, B], [S(d)]))
        elif v[j] == x[d]:
            sigs.append(sig([S(d), B, S(j)], [S(d)]))
    return sigs


# pooling ops linear in their first input (an average; a backward in its gradient)
POOL_LINEAR = {"aten.avg_pool2d.default", "aten._adaptive_avg_pool2d.default", "aten.avg_pool2d_backward.default",
               "aten._adaptive_avg_pool2d_backward.default", "aten.max_pool2d_with_indices_backward.default"}


def pool_linear_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    return [sig([P] + [B] * (len(ins) - 1), [P] * len(outs))] if name in POOL_LINEAR else []


def cross_entropy_rows_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """``cross_entropy_rows`` and its backward: rows split together (a row's softmax needs all its classes);
    the backward is linear in the row gradients."""
    sigs = [sig([S(0)] * len(ins), [S(0)])] if outs[0].shape[0] > 1 else []
    if name.endswith("backward.default"):
        sigs.append(sig([P] + [B] * (len(ins) - 1), [P]))
    return sigs
