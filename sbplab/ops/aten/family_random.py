"""Random ops (dropout, bernoulli, rand_like, randn_like): masks drawn over the global tensor, so every
strategy draws the same numbers.

Why: drawn per shard from each process's generator, a dropout mask depends on the strategy (data
parallel's two half batches get two copies of one pattern), and replicas of a replicated activation
agree only while every rank happens to draw in the same order. Instead each random op of a compiled
step is a stream of its own: the k-th random op of the forward draws from a generator seeded with
(seed, k), over the op's global shape, and each rank keeps the block of its shard. One call of the op
(one micro-batch) advances its stream by one draw on every rank that runs it, so shards, replicas,
pipeline stages and strategies all see one mask. ``seed`` is ``torch.initial_seed()`` when the step
is compiled (``torch.manual_seed(s)`` before ``sl.compile`` fixes it); each compile starts its streams
afresh and successive runs of one compiled step continue them.

The cost is the global draw on every rank (a dropout's mask is made whole, then sliced). The reference
is single-device torch with the same streams: ``same_masks(graph)`` is a TorchFunctionMode in which
``F.dropout`` draws as the compiled step does, call by call.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..registry import LocalContext, Signature, TensorMeta
from .family_pointwise import pointwise_signatures

RANDOM_OPS = ("aten.native_dropout.default", "aten.bernoulli.p", "aten.rand_like.default", "aten.randn_like.default")
_COMPILES = itertools.count()
_GENERATORS: dict[tuple, torch.Generator] = {}  # (seed, compile, k, rank, device type) -> its stream


def random_signatures(name: str, ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
    """Split as pointwise ops do (the draw is global, so any split keeps the same numbers); never P."""
    return pointwise_signatures(name, ins, outs, attrs)


def number_random_ops(graph) -> int:
    """Give each forward random op of ``graph`` its stream ``(seed, compile, k)`` in program order;
    returns how many there are."""
    seed, compile_id = torch.initial_seed(), next(_COMPILES)
    k = 0
    for op in graph.ops:
        if op.type in RANDOM_OPS and op.phase == "forward":
            op.attrs = {**op.attrs, "stream": (seed, compile_id, k)}
            k += 1
    return k


def random_localize(name: str):
    def localize(attrs: dict, ctx: LocalContext) -> dict:
        return {**attrs, "draw": (ctx.rank, ctx.out_metas[0].shape, ctx.out_blocks[0])}
    return localize


def _generator(key: tuple, device: torch.device) -> torch.Generator:
    gen = _GENERATORS.get(key)
    if gen is None:
        gen = _GENERATORS[key] = torch.Generator(device)
        gen.manual_seed(hash(key[:3]) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


def dropout_mask(gen: torch.Generator, shape: tuple, p: float, dtype: torch.dtype, device) -> torch.Tensor:
    """Dropout's keep mask over ``shape``: what both a compiled step and ``same_masks`` draw."""
    return torch.empty(shape, dtype=dtype, device=device).bernoulli_(1.0 - p, generator=gen).bool()


def _global_draw(name: str, args: tuple, gen: torch.Generator, shape: tuple, x: torch.Tensor) -> torch.Tensor:
    if name == "aten.native_dropout.default":
        return dropout_mask(gen, shape, float(args[1]), x.dtype, x.device)
    if name == "aten.bernoulli.p":
        return torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(float(args[1]), generator=gen)
    if name == "aten.rand_like.default":
        return torch.rand(shape, dtype=x.dtype, device=x.device, generator=gen)
    return torch.randn(shape, dtype=x.dtype, device=x.device, generator=gen)


def run_random(name: str, attrs: dict, args: tuple) -> tuple | None:
    """The op's result drawn from its stream, or None when the call is not one of a compiled step's
    (meta tensors, an op without a stream, dropout in eval mode): then torch runs it as it is."""
    x = args[0]
    stream = attrs.get("stream")
    if stream is None or x.device.type == "meta":
        return None
    if name == "aten.native_dropout.default" and (len(args) > 2 and args[2] is False or float(args[1]) == 0.0):
        return None
    rank, shape, block = attrs.get("draw", (-1, tuple(x.shape), tuple((0, n) for n in x.shape)))
    gen = _generator((*stream, rank, x.device.type), x.device)
    whole = _global_draw(name, args, gen, tuple(shape), x)
    mine = whole[tuple(slice(a, b) for a, b in block)]
    if name != "aten.native_dropout.default":
        return (mine.contiguous(),)
    p = float(args[1])
    return x * mine.to(x.dtype) * (1.0 / (1.0 - p)), mine.contiguous()


class same_masks(TorchFunctionMode):
    """Single-device torch with a compiled step's dropout masks: in this mode the k-th ``F.dropout`` call
    of each forward draws from the stream of the step's k-th random op (``number_random_ops``)."""

    def __init__(self, graph) -> None:
        super().__init__()
        self.streams = [op.attrs["stream"] for op in graph.ops if "stream" in op.attrs]
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.dropout or not self.streams:
            return func(*args, **kwargs)
        x = args[0]
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        training = kwargs.get("training", args[2] if len(args) > 2 else True)
        if not training or p == 0.0:
            return func(*args, **kwargs)
        stream = self.streams[self.calls % len(self.streams)]
        self.calls += 1
        mask = dropout_mask(_generator((*stream, "ref", x.device.type), x.device), tuple(x.shape), p, x.dtype,
                            x.device)
        return x * mask.to(x.dtype) * (1.0 / (1.0 - p))
