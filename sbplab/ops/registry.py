"""The op registry: every op is declared once, and every layer (eager, compiler, runtime) reads it.

An ``OpDef`` says how to infer output shapes, which 1-D SBP signatures the op accepts, how to run
it on local shards, and what it costs. n-D signatures are the product of the 1-D lists over mesh
axes, kept only where every rank's local shapes agree with what the SBPs promise; the all-B
signature is always added. That local-shape check is what rejects products that do not nest
(two mesh axes splitting one dimension of one input but not of another).
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from ..errors import SbplabError
from ..freeze import freeze as _freeze  # noqa: F401  (the name eager/dispatch.py imports)
from ..freeze import freeze_attrs
from ..layout import Block, local_block, mesh_blocks, numel, partial_ok
from ..placement import Placement
from ..sbp import B, NdSbp, SbpParallel, Split, fmt_sbp, normalize_split


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of a tensor, all the registry needs to reason about it."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        return TensorMeta(tuple(t.shape), t.dtype)


@dataclass(frozen=True)
class Signature:
    """A 1-D SBP signature: one SBP per input and per output, on one mesh axis."""

    inputs: tuple[SbpParallel, ...]
    outputs: tuple[SbpParallel, ...]

    def __repr__(self) -> str:
        ins = ", ".join(map(repr, self.inputs))
        outs = ", ".join(map(repr, self.outputs))
        return f"{ins} -> {outs}"


@dataclass(frozen=True)
class NdSignature:
    """An n-D signature: one n-D SBP per input and per output."""

    inputs: tuple[NdSbp, ...]
    outputs: tuple[NdSbp, ...]

    def __repr__(self) -> str:
        ins = ", ".join(fmt_sbp(x) for x in self.inputs)
        outs = ", ".join(fmt_sbp(x) for x in self.outputs)
        return f"{ins} -> {outs}"


@dataclass(frozen=True)
class LocalContext:
    """What a kernel may need to know about its shard: the global blocks of inputs and outputs."""

    in_metas: tuple[TensorMeta, ...]  # global
    out_metas: tuple[TensorMeta, ...]  # global
    in_blocks: tuple[Block, ...]
    out_blocks: tuple[Block, ...]
    signature: NdSignature
    rank: int = -1  # the rank whose shard this is (-1 where no one rank is meant: a validity check)


InferFn = Callable[[Sequence[TensorMeta], dict], list[TensorMeta]]
SignaturesFn = Callable[[Sequence[TensorMeta], dict], list[Signature]]
KernelFn = Callable[[Sequence[torch.Tensor], dict], Sequence[torch.Tensor]]
FlopsFn = Callable[[Sequence[TensorMeta], Sequence[TensorMeta], dict], int]
LocalizeFn = Callable[[dict, LocalContext], dict]
IntoFn = Callable[[Sequence[torch.Tensor], dict, torch.Tensor], None]


def _no_localize(attrs: dict, ctx: LocalContext) -> dict:
    return attrs


# Where a random op's numbers come from (its stream, the rank's block of the global draw:
# ``ops/aten/family_random.py``): they never change shapes, signatures or FLOPs, so caches of those
# leave them out of their keys, and every dropout of one shape shares one answer.
RNG_ATTRS = ("stream", "draw")


def shape_key(attrs: dict) -> Any:
    """``freeze(attrs)`` without ``RNG_ATTRS``: the key of answers that depend on shapes alone (attributes
    already hashable, as a graph's are, are not walked again: ``freeze_attrs``)."""
    if any(k in attrs for k in RNG_ATTRS):
        attrs = {k: v for k, v in attrs.items() if k not in RNG_ATTRS}
    return freeze_attrs(attrs)


def _zero_flops(ins: Sequence[TensorMeta], outs: Sequence[TensorMeta], attrs: dict) -> int:
    return 0


@dataclass
class OpDef:
    """One op, declared once.

    - ``infer(in_metas, attrs)`` -> output metas; raises ValueError naming the op on bad shapes.
    - ``signatures(in_metas, attrs)`` -> the op's valid 1-D signatures (all-B is added for you);
      split dims in them are non-negative.
    - ``kernel(local_inputs, local_attrs)`` -> local outputs (a tuple); plain torch.
    - ``localize(attrs, ctx)`` -> attrs for one shard (a reshape's target shape, an embedding's
      vocabulary offset, a mean's global count).
    - ``flops(in_metas, out_metas, attrs)`` -> floating point operations of the global op.
    - ``kernel_into(local_inputs, local_attrs, out)``, optional, one-output ops only: the kernel's
      result written into ``out`` (a view of a gradient bucket), bit for bit what ``kernel`` returns.
    """

    name: str
    infer: InferFn
    signatures: SignaturesFn
    kernel: KernelFn
    flops: FlopsFn = _zero_flops
    localize: LocalizeFn = _no_localize
    variadic: bool = False  # inputs are a list of any length (concat)
    kernel_into: IntoFn | None = None
    doc: str = ""

    def bytes_moved(self, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta]) -> int:
        """Bytes read and written by the global op (a roofline's memory term)."""
        return sum(m.nbytes for m in ins) + sum(m.nbytes for m in outs)


class UnknownOpError(SbplabError, KeyError):
    """No op of that name is registered; the message suggests the closest registered names."""


REGISTRY: dict[str, OpDef] = {}
FORGETTERS: list[Callable[[], None]] = []  # layers above keep caches of signatures and scores: cleared with these


def forget_cached_answers() -> None:
    """Clear everything cached from ops' rules (a rule changed: ``sl.register_rule``)."""
    _nd_signatures_cached.cache_clear()
    for forget in FORGETTERS:
        forget()


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} is registered twice")
    REGISTRY[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        if isinstance(name, str) and name.count(".") == 2 and all(name.split(".")):  # "aten.mm.default"
            from .aten import make_aten_opdef
            from .aten.calls import overload

            try:
                overload(name)
                return register(make_aten_opdef(name))
            except UnknownOpError:
                if not name.startswith(("aten.", "prims.")):  # a library op this process has not loaded (a
                    return make_aten_opdef(name)  # worker's): resolved from its captured module when it runs
        close = difflib.get_close_matches(str(name), list(REGISTRY), n=3)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise UnknownOpError(
            f"no op named {name!r}{hint}; sbplab.ops.REGISTRY holds every registered op"
        ) from None


def one_d_signatures(op: OpDef, in_metas: Sequence[TensorMeta], attrs: dict) -> list[Signature]:
    """The op's 1-D signatures with normalised dims and all-B first, without duplicates."""
    out_metas = op.infer(in_metas, attrs)
    all_b = Signature(tuple(B for _ in in_metas), tuple(B for _ in out_metas))
    seen: dict[Signature, None] = {all_b: None}
    from .chunked import lift  # strided splits (S(d, chunks=k)) where the op treats a dim's positions alike

    for sig in lift(op.name, op.signatures(in_metas, attrs), in_metas, out_metas):
        if not all(partial_ok(x, m.dtype) for x, m in [*zip(sig.inputs, in_metas), *zip(sig.outputs, out_metas)]):
            continue  # no partial bools, no P(max)/P(min) of complex values (layout.partial_ok)
        norm = Signature(
            tuple(normalize_split(x, len(m.shape), op.name) for x, m in zip(sig.inputs, in_metas)),
            tuple(normalize_split(x, len(m.shape), op.name) for x, m in zip(sig.outputs, out_metas)),
        )
        seen.setdefault(norm, None)
    return list(seen)


def _blocks_fit(metas: Sequence[TensorMeta], sbps: Sequence[NdSbp], placement: Placement, rank: int):
    blocks = []
    for m, nd in zip(metas, sbps):
        blk = local_block(m.shape, placement, nd, rank)
        if any(e - s <= 0 for s, e in blk) and m.numel > 0:
            return None
        blocks.append(blk)
    return tuple(blocks)


def local_context(op: OpDef, in_metas: Sequence[TensorMeta], attrs: dict, sig: NdSignature,
                  placement: Placement, rank: int, out_metas: tuple[TensorMeta, ...] | None = None
                  ) -> LocalContext | None:
    """The shard-level view of ``sig`` on ``rank``, or None if some shard would be empty. ``out_metas``: the
    op's global outputs where the caller has them (the same on every rank)."""
    out_metas = tuple(op.infer(in_metas, attrs)) if out_metas is None else out_metas
    ib = _blocks_fit(in_metas, sig.inputs, placement, rank)
    ob = _blocks_fit(out_metas, sig.outputs, placement, rank)
    if ib is None or ob is None:
        return None
    return LocalContext(tuple(in_metas), out_metas, ib, ob, sig, rank)


def _nd_valid(op: OpDef, in_metas: tuple[TensorMeta, ...], attrs: dict, sig: NdSignature,
              placement: Placement) -> bool:
    """Every rank's local input shapes infer exactly the local output shapes the SBPs promise."""
    out_metas = tuple(op.infer(in_metas, attrs))
    rows = ((_blocks_fit(in_metas, sig.inputs, placement, r), _blocks_fit(out_metas, sig.outputs, placement, r))
            for r in placement.rank_list)
    return _valid_on_ranks(op, in_metas, out_metas, attrs, sig, _distinct(rows))


def _distinct(rows: Iterable[tuple]) -> Iterator[tuple]:
    seen: set = set()
    for row in rows:
        if row not in seen:
            seen.add(row)
            yield row


def _valid_on_ranks(op: OpDef, in_metas: tuple[TensorMeta, ...], out_metas: tuple[TensorMeta, ...], attrs: dict,
                    sig: NdSignature, rows: Iterable[tuple[tuple[Block, ...] | None, tuple[Block, ...] | None]],
                    seen: dict | None = None) -> bool:
    """``_nd_valid`` given the (input blocks, output blocks) of each rank in rank order (None: an
    empty shard), leaving out ranks that hold the same blocks as an earlier one: those get the same
    local attributes and shapes, so each distinct pair of blocks is checked once.

    ``seen`` keeps answers across the signatures of one op, inputs and attributes: an op without
    ``localize`` sees only the local shapes, so a row of local input and output shapes checked before
    has that answer (the same pieces recur in many signatures); a localized op sees its local
    attributes too, so they join the key (less ``RNG_ATTRS``, which never change a shape)."""
    plain = op.localize is _no_localize  # it would return the attrs as they are, ignoring ctx
    for ib, ob in rows:
        if ib is None or ob is None:
            return False
        local = tuple([tuple([e - s for s, e in blk]) for blk in ib])
        want = tuple([tuple([e - s for s, e in blk]) for blk in ob])
        here: dict | None = None  # a plain op's attributes are copied only when it must infer
        if not plain:
            try:
                here = op.localize(dict(attrs), LocalContext(in_metas, out_metas, ib, ob, sig))
            except (ValueError, RuntimeError, IndexError):
                return False
        key: Any = None
        if seen is not None:  # a localized op (a dropout with its draw) is keyed by its local attrs too
            key = (local, want) if plain else (local, want, shape_key(here))
            try:
                hash(key)
            except TypeError:
                key = None  # attributes that cannot key a dict: no sharing
        ok = None if key is None else seen.get(key)  # type: ignore[union-attr]
        if ok is None:
            local_in = [TensorMeta(sh, m.dtype) for sh, m in zip(local, in_metas)]
            try:
                got = op.infer(local_in, dict(attrs) if here is None else here)
                ok = tuple([tuple(g.shape) for g in got]) == want
            except (ValueError, RuntimeError, IndexError):
                ok = False
            if key is not None:
                seen[key] = ok  # type: ignore[index]
        if not ok:
            return False
    return True


@lru_cache(maxsize=16384)
def _rank_blocks(shape: tuple[int, ...], nd: NdSbp, mesh_shape: tuple[int, ...]
                 ) -> tuple[tuple[Block | None, ...], tuple[int, ...]]:
    """Per rank of a mesh of this shape (ranks row-major): the block ``local_block`` gives, or None where
    it is empty (as ``_blocks_fit`` rejects it); and the first rank holding an equal block. Every op with
    a tensor of this shape asks again, so it is kept."""
    every = mesh_blocks(shape, mesh_shape, nd)
    empty_ok = numel(shape) == 0
    blocks: list[Block | None] = []
    first: list[int] = []
    at: dict[Block | None, int] = {}
    for blk in every:
        kept = None if not empty_ok and any(e - s <= 0 for s, e in blk) else blk
        first.append(at.setdefault(kept, len(blocks)))
        blocks.append(kept)
    return tuple(blocks), tuple(first)


def _canonical_rows(in_metas: Sequence[TensorMeta], out_metas: Sequence[TensorMeta], sig: NdSignature,
                    mesh_shape: tuple[int, ...]) -> Iterator[tuple]:
    """(input blocks, output blocks) per rank of the canonical mesh as ``_blocks_fit`` gives them, in
    rank order, leaving out ranks whose every block equals an earlier rank's."""
    ins = [_rank_blocks(m.shape, nd, mesh_shape) for m, nd in zip(in_metas, sig.inputs)]
    outs = [_rank_blocks(m.shape, nd, mesh_shape) for m, nd in zip(out_metas, sig.outputs)]
    firsts = [t[1] for t in ins] + [t[1] for t in outs]
    if not firsts:  # no tensors: every rank holds the same (nothing), one row
        yield ((), ())
        return
    seen: set[tuple[int, ...]] = set()
    for k, same_as in enumerate(zip(*firsts)):  # per rank: the first rank holding each of its blocks
        if same_as in seen:
            continue
        seen.add(same_as)
        ib = tuple([t[0][k] for t in ins])
        ob = tuple([t[0][k] for t in outs])
        yield (None if None in ib else ib, None if None in ob else ob)


def _strided_alone(nd: tuple) -> bool:
    """No mesh axis splits the dim of another axis's strided split (the chunks of a piece are not a piece of
    the chunks)."""
    dims = [x.dim for x in nd if isinstance(x, Split)]
    return all(dims.count(x.dim) == 1 for x in nd if isinstance(x, Split) and x.chunks > 1)


@lru_cache(maxsize=4096)
def _nd_signatures_cached(name: str, in_metas: tuple[TensorMeta, ...], frozen: tuple,
                          mesh_shape: tuple[int, ...]) -> tuple[NdSignature, ...]:
    op = get_op(name)
    attrs = dict(frozen)
    ones = one_d_signatures(op, in_metas, attrs)
    out: list[NdSignature] = []
    out_metas: tuple[TensorMeta, ...] | None = None
    seen: dict = {}  # _valid_on_ranks' answers for this op, inputs and attributes
    strided = any(isinstance(x, Split) and x.chunks > 1 for one in ones for x in (*one.inputs, *one.outputs))
    for combo in itertools.product(ones, repeat=len(mesh_shape)):
        sig = NdSignature(
            tuple([tuple([c.inputs[i] for c in combo]) for i in range(len(in_metas))]),
            tuple([tuple([c.outputs[j] for c in combo]) for j in range(len(combo[0].outputs))]),
        )
        if out_metas is None:  # what local_context infers for every rank of every signature
            out_metas = tuple(op.infer(in_metas, attrs))
        if strided and not all(_strided_alone(nd) for nd in (*sig.inputs, *sig.outputs)):
            continue  # a strided split must be the only split of its dim (layout._check_chunked)
        rows = _canonical_rows(in_metas, out_metas, sig, mesh_shape)
        if _valid_on_ranks(op, in_metas, out_metas, attrs, sig, rows, seen):
            out.append(sig)
    return tuple(out)


def nd_signatures(op: OpDef | str, in_metas: Sequence[TensorMeta], attrs: dict,
                  placement: Placement) -> list[NdSignature]:
    """All valid n-D signatures of ``op`` for these inputs on this mesh (all-B first).

    Validity depends only on the mesh shape, not on which ranks are in it, so results are cached
    per (op, shapes, attrs, mesh shape). Attribute values must be hashable or lists (lists are
    passed to the op as tuples).
    """
    op = get_op(op) if isinstance(op, str) else op
    return list(_nd_signatures_cached(op.name, tuple(in_metas), shape_key(attrs), placement.shape))


def run_local(op: OpDef | str, local_inputs: Sequence[torch.Tensor], attrs: dict,
              in_metas: Sequence[TensorMeta], sig: NdSignature, placement: Placement,
              rank: int) -> tuple[torch.Tensor, ...]:
    """Run one rank's shard of ``op`` under ``sig``."""
    op = get_op(op) if isinstance(op, str) else op
    ctx = local_context(op, in_metas, attrs, sig, placement, rank)
    if ctx is None:
        raise ValueError(f"{op.name}: signature {sig} leaves rank {rank} an empty shard")
    return tuple(op.kernel(list(local_inputs), op.localize(dict(attrs), ctx)))
