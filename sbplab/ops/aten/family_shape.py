"""Shape ops as dim maps (DTensor's view rules, in sbplab's balanced splits).

A reshape groups input dims with the output dims they become (``(B, T, C) -> (B*T, C)``: ``[B, T]``
with ``[B*T]``, ``[C]`` with ``[C]``); a split on the first dim of a group is a split on the first
dim of its partner. The registry then keeps a signature only where every rank's local shapes come
out as the SBPs promise, which for prefix-contiguous blocks means the pieces really coincide.
Shape ops are linear, so they all pass P.
"""

from __future__ import annotations

from ...sbp import Split
from ..chunked import CHUNKS
from ..registry import LocalContext, Signature, TensorMeta
from ._common import B, P, S, arg, norm_dim, sig, with_arg


def view_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Pairs (input dims, output dims) of equal products, size-1 dims left out."""
    ia = [i for i, n in enumerate(a) if n != 1]
    ib = [j for j, n in enumerate(b) if n != 1]
    groups, i, j = [], 0, 0
    while i < len(ia) and j < len(ib):
        gi, gj = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(ia):
                gi.append(ia[i])
                pa *= a[ia[i]]
                i += 1
            elif pb < pa and j < len(ib):
                gj.append(ib[j])
                pb *= b[ib[j]]
                j += 1
            else:
                return groups
        groups.append((gi, gj))
    return groups


def reshape_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    sigs = [sig([S(gi[0])], [S(gj[0])]) for gi, gj in view_groups(ins[0].shape, outs[0].shape)]
    return sigs + [sig([P], [P])]


def dim_map_signatures(ins: list[TensorMeta], outs: list[TensorMeta], out_of_in: dict[int, int],
                       linear: bool = True) -> list[Signature]:
    """Input dim d becomes output dim ``out_of_in[d]`` (dims not in the map cannot be split)."""
    sigs = [sig([S(d)], [S(o)] * len(outs)) for d, o in out_of_in.items() if ins[0].shape[d] > 1]
    return sigs + ([sig([P] * len(ins), [P] * len(outs))] if linear else [])


def permute_map(name: str, ins: list[TensorMeta], attrs: dict) -> dict[int, int]:
    nd = len(ins[0].shape)
    if name == "aten.t.default":
        return {0: 1, 1: 0} if nd == 2 else {0: 0}
    if name == "aten.transpose.int":
        d0, d1 = norm_dim(arg(attrs, 1, "dim0"), nd), norm_dim(arg(attrs, 2, "dim1"), nd)
        perm = list(range(nd))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = [norm_dim(d, nd) for d in arg(attrs, 1, "dims")]
    return {src: dst for dst, src in enumerate(perm)}


def drop_dim_map(nd: int, dim: int) -> dict[int, int]:
    """select / unbind: every dim but ``dim`` survives, later ones one lower."""
    return {d: d - (d > dim) for d in range(nd) if d != dim}


def keep_other_dims(nd: int, dim: int) -> dict[int, int]:
    """slice / split / narrow along ``dim``: the other dims keep their place."""
    return {d: d for d in range(nd) if d != dim}


def slice_map(name: str, ins: list[TensorMeta], attrs: dict) -> dict[int, int]:
    """slice / split / narrow keep the other dims; a slice that keeps the whole dim (start 0, step 1,
    end past it) is the identity, so that dim splits too (each rank's slice is its whole shard)."""
    nd = len(ins[0].shape)
    dim = norm_dim(arg(attrs, 2 if name.startswith("aten.split") else 1, "dim", 0), nd)
    if name == "aten.slice.Tensor" and arg(attrs, 2, "start") in (None, 0) and arg(attrs, 4, "step", 1) == 1:
        end = arg(attrs, 3, "end")
        if end is None or end >= ins[0].shape[dim]:
            return {d: d for d in range(nd)}
    return keep_other_dims(nd, dim)


def expand_signatures(ins: list[TensorMeta], outs: list[TensorMeta]) -> list[Signature]:
    """A kept dim splits as itself; an expanded (size-1 or new) dim splits the output of a B input."""
    x, out = ins[0].shape, outs[0].shape
    lead = len(out) - len(x)
    sigs = []
    for d in range(len(out)):
        if out[d] <= 1:
            continue
        k = d - lead
        sigs.append(sig([S(k) if k >= 0 and x[k] == out[d] else B], [S(d)]))
    return sigs + [sig([P], [P])]


def cat_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    nd = len(outs[0].shape)
    dim = norm_dim(arg(attrs, 1, "dim", 0), nd)
    parts = [m for m in ins if len(m.shape) == nd]  # torch.cat skips 1-D empty tensors
    sigs = [sig([S(d) if len(m.shape) == nd else B for m in ins], [S(d)]) for d in range(nd)
            if d != dim and outs[0].shape[d] > 1 and all(m.shape[d] == outs[0].shape[d] for m in parts)]
    if len(parts) == len(ins) and equal_parts(outs[0].shape[dim], [m.shape[dim] for m in ins]):
        sigs.append(sig([S(dim)] * len(ins), [Split(dim, len(ins))]))  # q, k, v grads back into the fused one
    return sigs + [sig([P] * len(ins), [P])]


def stack_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    nd = len(ins[0].shape)
    dim = norm_dim(arg(attrs, 1, "dim", 0), nd + 1)
    sigs = [sig([S(d)] * len(ins), [S(d + (d >= dim))]) for d in range(nd) if ins[0].shape[d] > 1]
    return sigs + [sig([P] * len(ins), [P])]


def pad_signatures(ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    """constant_pad_nd: unpadded dims split; P passes only when padding with 0."""
    nd = len(ins[0].shape)
    pad = arg(attrs, 1, "pad", ())
    padded = {nd - 1 - i // 2 for i, p in enumerate(pad) if p != 0}
    sigs = [sig([S(d)], [S(d)]) for d in range(nd) if d not in padded and ins[0].shape[d] > 1]
    return sigs + ([sig([P], [P])] if arg(attrs, 2, "value", 0) == 0 else [])


def equal_parts(n: int, sizes: list[int]) -> int:
    """How many equal parts ``sizes`` cuts ``n`` into (0 when they are not equal or not a chunk count we lift)."""
    return len(sizes) if len(sizes) in CHUNKS and sum(sizes) == n and len(set(sizes)) == 1 else 0


def split_sizes(name: str, n: int, attrs: dict) -> list[int]:
    if name == "aten.split_with_sizes.default":
        return list(arg(attrs, 1, "split_sizes", ()))
    size = arg(attrs, 1, "split_size", n)
    return [min(size, n - i) for i in range(0, n, size)] if size > 0 else []


def split_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    """split / split_with_sizes: the other dims keep their split (``slice_map``); a strided split of the
    cut dim into as many chunks as the op makes equal parts is a plain split of each part (a fused QKV
    output cut into q, k and v: each rank's heads of each)."""
    sigs = dim_map_signatures(ins, outs, slice_map(name, ins, attrs))
    nd = len(ins[0].shape)
    dim = norm_dim(arg(attrs, 2, "dim", 0), nd)
    k = equal_parts(ins[0].shape[dim], split_sizes(name, ins[0].shape[dim], attrs))
    return sigs + ([sig([Split(dim, k)], [S(dim)] * k)] if k else [])


def split_localize(name: str):
    """On a strided split of the cut dim a rank holds ``local`` elements of it, ``local / k`` of each part."""
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        nd = len(ctx.in_metas[0].shape)
        dim = norm_dim(arg(attrs, 2, "dim", 0), nd)
        s, e = ctx.in_blocks[0][dim]
        n = ctx.in_metas[0].shape[dim]
        if e - s == n:
            return attrs
        k = len(split_sizes(name, n, attrs))
        if name == "aten.split_with_sizes.default":
            return with_arg(attrs, 1, "split_sizes", [(e - s) // k] * k)
        return with_arg(attrs, 1, "split_size", (e - s) // k)
    return localize
