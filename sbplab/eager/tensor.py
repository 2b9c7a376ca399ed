"""Global tensors, eager: one logical tensor, one local shard per rank, all held in this process.

This is the teaching and testing face of SBP: every method runs the ATen ops torch calls for it
(``aten_eager.py``) through the same rules and boxing planner the compiler uses, so there is one set
of rules, not two.

    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    x = sl.tensor(torch.randn(8, 6), placement=mesh, sbp="S(0), S(1)")   # (8, 6) (S(0), S(1))
    x.local_shapes   # {0: (4, 3), 1: (4, 3), 2: (4, 3), 3: (4, 3)}
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping, Sequence

import torch

from ..boxing import plan_boxing
from ..errors import InputError, InputKeyError, InputTypeError, OpError
from ..layout import assemble, shard
from ..ops._util import norm_dim
from ..ops.registry import TensorMeta, UnknownOpError, get_op
from ..ops.signature_text import SignatureError
from ..placement import Placement
from ..sbp import B, NdSbp, as_nd_sbp, fmt_sbp
from ..viz.layout_picture import type_string
from .aten_eager import METHODS, check_forced, renumber, steps_of
from .dispatch import decide, default_hardware, normalise_out_sbp
from .records import BoxingRecord, OpRecord, Record, emit
from .torch_calls import TORCH_CALLS, traced_steps

_names = itertools.count()


def _fresh_name(prefix: str = "t") -> str:
    return f"{prefix}{next(_names)}"




class GlobalTensor:
    """A logical tensor with a placement, an n-D SBP and one local shard per rank.

    ``P`` shards are raw addends (or candidates for P(max)/P(min)); ``.full()`` reduces them.
    ``.record`` says how the tensor was made (an OpRecord or a BoxingRecord).
    """

    def __init__(self, shards: Mapping[int, torch.Tensor], placement: Placement, sbp: NdSbp,
                 shape: Sequence[int], name: str | None = None, record: Record | None = None):
        self.placement = placement
        self.sbp: NdSbp = tuple(sbp)
        self.shape = torch.Size(shape)
        self.shards: dict[int, torch.Tensor] = dict(shards)
        self.name = name or _fresh_name()
        self.record = record

    # --- what it is ------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.shards.values())).dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(tuple(self.shape), self.dtype)

    @property
    def local_shapes(self) -> dict[int, tuple[int, ...]]:
        return {r: tuple(t.shape) for r, t in self.shards.items()}

    def to_local(self, rank: int) -> torch.Tensor:
        if rank not in self.shards:
            raise InputKeyError(f"{self.name}: rank {rank} is not in {self.placement}")
        return self.shards[rank]

    def full(self) -> torch.Tensor:
        """The logical value as a plain torch.Tensor (partial shards are reduced)."""
        return assemble(self.shards, self.placement, self.sbp)

    def type_str(self) -> str:
        """JAX-style type with the sharding written in: ``f32[8@dp,6]``, ``{P:tp}`` for partial axes."""
        return type_string(self.shape, self.placement, self.sbp, self.dtype)

    def __repr__(self) -> str:
        locs = sorted(set(self.local_shapes.values()))
        loc = locs[0] if len(locs) == 1 else locs
        return (f"GlobalTensor({self.name}: {self.type_str()}, sbp={fmt_sbp(self.sbp)}, "
                f"placement={self.placement}, local={loc})")

    # --- changing layout --------------------------------------------------------------------
    def to_global(self, placement: Placement | None = None, sbp=None, hardware=None) -> GlobalTensor:
        """Box to another SBP and/or placement; the plan is kept in ``.record``."""
        dst_p = placement or self.placement
        dst_sbp = self.sbp if sbp is None else as_nd_sbp(sbp, dst_p.ndim, self.ndim, what=self.name)
        return self._box(dst_sbp, dst_p, reason="to_global", hardware=hardware)

    def _box(self, dst_sbp: NdSbp, dst_p: Placement, reason: str, plan=None, hardware=None) -> GlobalTensor:
        if plan is None:
            plan = plan_boxing(tuple(self.shape), self.sbp, dst_sbp, self.placement,
                               dst_placement=None if dst_p == self.placement else dst_p,
                               dtype=self.dtype, hardware=hardware or default_hardware())
        rec = BoxingRecord(self.name, reason, plan)
        out = GlobalTensor(plan.run(self.shards), dst_p, dst_sbp, self.shape,
                           name=f"{self.name}'", record=rec)
        if reason == "to_global":
            emit(rec)
        return out

    # --- ops ---------------------------------------------------------------------------------
    def __matmul__(self, other): return apply("matmul", [self, other])
    def __rmatmul__(self, other): return apply("matmul", [other, self])
    def __add__(self, other): return apply("add", [self, other])
    def __radd__(self, other): return apply("add", [other, self])
    def __sub__(self, other): return apply("sub", [self, other])
    def __rsub__(self, other): return apply("sub", [other, self])
    def __mul__(self, other): return apply("mul", [self, other])
    def __rmul__(self, other): return apply("mul", [other, self])
    def __truediv__(self, other): return apply("div", [self, other])
    def __rtruediv__(self, other): return apply("div", [other, self])
    def __neg__(self): return apply("neg", [self])

    def relu(self): return apply("relu", [self])
    def gelu(self, approximate: str = "none"): return apply("gelu", [self], approximate=approximate)
    def tanh(self): return apply("tanh", [self])
    def exp(self): return apply("exp", [self])

    def sum(self, dim=None, keepdim: bool = False):
        return apply("sum", [self], dims=_dims(dim, self.shape, "sum"), keepdim=keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        return apply("mean", [self], dims=_dims(dim, self.shape, "mean"), keepdim=keepdim)

    def max(self, dim: int, keepdim: bool = False):
        return apply("max", [self], dim=_dim(dim, self.shape, "max"), keepdim=keepdim)

    def softmax(self, dim: int): return apply("softmax", [self], dim=_dim(dim, self.shape, "softmax"))
    def log_softmax(self, dim: int): return apply("log_softmax", [self], dim=_dim(dim, self.shape, "log_softmax"))

    def reshape(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return apply("reshape", [self], shape=_resolve_shape(shape, self.shape, self.name))

    view = reshape

    def transpose(self, dim0: int, dim1: int):
        return apply("transpose", [self], dim0=_dim(dim0, self.shape, "transpose"),
                     dim1=_dim(dim1, self.shape, "transpose"))

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        return apply("permute", [self], dims=tuple(_dim(d, self.shape, "permute") for d in dims))

    @property
    def T(self):
        return self.transpose(-2, -1)

    def __getitem__(self, index):
        """Basic slicing ``x[:, 2:5]`` on one dimension at a time, through the ``slice`` op."""
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) > self.ndim:
            raise InputError(f"{self.name}: {len(index)} indices for a {self.ndim}-D tensor of shape {tuple(self.shape)}")
        out = self
        for d, idx in enumerate(index):
            if idx == slice(None):
                continue
            if not isinstance(idx, slice):
                raise InputTypeError(f"{self.name}: only slices like x[a:b] are supported, got {idx!r}")
            start, stop, step = idx.indices(self.shape[d])
            out = apply("slice", [out], dim=d, start=start, stop=stop, step=step)
        return out


def _dim(dim, shape: torch.Size, op: str) -> int:
    """``dim`` made non-negative; out of range (or not an int) is an OpError, as in torch (never taken modulo)."""
    return norm_dim(op, dim, shape)


def _dims(dim, shape: torch.Size, op: str) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(len(shape)))
    if isinstance(dim, int):
        return (_dim(dim, shape, op),)
    if not isinstance(dim, (tuple, list)):
        raise InputTypeError(f"{op}: dim must be an int, a tuple of ints or None, got {dim!r}")
    return tuple(_dim(d, shape, op) for d in dim)


def _resolve_shape(shape: tuple, old: torch.Size, name: str) -> tuple[int, ...]:
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise InputTypeError(f"{name}: reshape takes ints (one may be -1), got {shape}")
    numel = 1
    for s in old:
        numel *= s
    if shape.count(-1) > 1:
        raise InputError(f"{name}: reshape to {shape} has more than one -1")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if -1 in shape:
        if known == 0 or numel % known:
            raise InputError(f"{name}: cannot reshape {tuple(old)} to {shape}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    return tuple(int(s) for s in shape)


def _lift(x, like: GlobalTensor) -> GlobalTensor:
    """Python numbers and plain tensors join an op as broadcast tensors on ``like``'s placement.

    A number takes the dtype torch would give ``like`` op number (``int_tensor * 0.5`` is a float, ``bool_tensor
    + 2`` an int), so the op's own promotion then gives torch's result dtype; a bool stays a bool (it never
    wins a promotion, and torch refuses to subtract it).
    """
    if isinstance(x, GlobalTensor):
        return x
    if not isinstance(x, (torch.Tensor, bool, int, float, complex)):
        raise InputTypeError(f"{like.name}: cannot combine a global tensor with a {type(x).__name__}; use a number, a "
                             f"torch.Tensor or a global tensor")
    try:
        dtype = None if isinstance(x, (torch.Tensor, bool)) else torch.result_type(torch.empty(1, dtype=like.dtype), x)
        t = torch.as_tensor(x, dtype=dtype)
    except (OverflowError, RuntimeError) as e:  # as torch: 10**30 fits no tensor
        raise InputError(f"{like.name}: the number {x!r} does not fit a tensor to combine with {like.dtype}: {e}") from None
    return tensor(t, placement=like.placement, sbp=(B,) * like.placement.ndim,
                  name=_fresh_name("const"))


def apply(op_name: str, inputs: Sequence, signature=None, sbp=None, name: str | None = None,
          **attrs) -> GlobalTensor | tuple[GlobalTensor, ...]:
    """Run an op on global tensors: choose a signature, box the inputs, run each shard.

    Every name runs as the ATen ops torch calls for it, under the family rules a compiled graph uses
    (one home per rule): a global tensor's methods ("matmul", "add", "sum", "softmax", "reshape", ...;
    ``aten_eager.py``), the torch functions of ``torch_calls.TORCH_CALLS`` ("linear", "layer_norm",
    "embedding", "conv2d", "cross_entropy", ...: traced from torch), an ATen overload such as
    ``"aten.mm.default"`` with ``args=``, and sbplab's optimizer updates ("sgd_update", ...).
    ``signature`` forces one ("S(0), B -> S(0)" on a 1-D mesh, or an NdSignature); ``sbp`` forces the
    output SBP (the cheapest signature producing it is used).
    """
    anchor = next((x for x in inputs if isinstance(x, GlobalTensor)), None)
    if anchor is None:
        raise InputTypeError(f"{op_name}: needs at least one global tensor input")
    xs = [_lift(x, anchor) for x in inputs]
    for x in xs:
        if x.placement != anchor.placement:
            raise InputError(
                f"{op_name}: inputs live on different placements: {anchor.name} on {anchor.placement}, "
                f"{x.name} on {x.placement}; move one with .to_global(placement=...) first")
    metas = [x.meta for x in xs]
    steps = steps_of(op_name, metas, attrs)
    if steps is not None:
        check_forced(op_name, steps, signature)
        get_op(op_name).infer(metas, attrs)  # bad shapes or dtypes: the op's own clear error
        results: tuple[int, ...] = (len(xs) + len(steps) - 1,)  # each method step makes one value
        named = len(steps) - 1
    elif op_name in TORCH_CALLS:
        traced = traced_steps(op_name, metas, attrs)
        steps, results = list(traced.steps), traced.results
        named = next(k for k, s in enumerate(steps) if s.main)  # the step making the result
        if signature is not None and len(steps) > 1:
            raise SignatureError(op_name, f"{op_name}: a forced signature needs an op torch runs as one ATen op; "
                                          f"this one runs as {', '.join(s.op for s in steps)}: force the output "
                                          f"SBP with sbp=... instead")
    elif isinstance(op_name, str) and (op_name.count(".") == 2 or op_name in OWN_OPS):
        return _run(op_name, op_name, xs, attrs, signature, sbp, name)
    else:
        raise unknown_eager_op(op_name)
    vals: list = list(xs)
    for k, st in enumerate(steps):
        order: list[int] = []
        call = {"args": renumber(st.args, order), "kwargs": renumber(st.kwargs, order)}
        out = _run(st.op, op_name, [vals[i] for i in order], call, signature if st.main else None,
                   sbp if st.main else None, name if k == named else None, anchor.placement)
        vals.extend(out if isinstance(out, tuple) else (out,))
    got = tuple(vals[i] for i in results)
    return got[0] if len(got) == 1 else got


OWN_OPS = ("sgd_update", "sgd_momentum_update", "adam_update", "step_count")  # sbplab's optimizer updates


def unknown_eager_op(op_name) -> UnknownOpError:
    """The error for a name ``sl.apply`` does not take, with the closest names it does."""
    names = [*METHODS, *TORCH_CALLS, *OWN_OPS]
    close = difflib.get_close_matches(str(op_name), names, n=3)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    return UnknownOpError(f"no eager op named {op_name!r}{hint}; sl.apply takes {', '.join(names)}, or an ATen "
                          f"overload such as 'aten.mm.default' with args=")


def _run(op_name: str, display: str, xs: list[GlobalTensor], attrs: dict, signature, sbp,
         name: str | None, placement: Placement | None = None) -> GlobalTensor | tuple[GlobalTensor, ...]:
    """One registry op on global tensors of one placement (``placement``: where an op with no tensor
    input, a factory, makes its output); errors and records say ``display``."""
    placement = xs[0].placement if xs else placement
    op = get_op(op_name)
    metas = [x.meta for x in xs]
    try:
        out_ndim = len(op.infer(metas, attrs)[0].shape)
    except (RuntimeError, NotImplementedError) as e:  # torch refuses on meta tensors what it would refuse on shards
        raise OpError(f"{display}: torch cannot run it on {', '.join(x.name for x in xs)} (shapes "
                      f"{[m.shape for m in metas]}, dtypes {[m.dtype for m in metas]}): {e}") from e
    dec = decide(op_name, metas, [x.sbp for x in xs], attrs, placement, signature=signature,
                 out_sbp=normalise_out_sbp(sbp, placement, out_ndim, display), display=display)
    sig = dec.signature
    boxings = []
    boxed = []
    for i, (x, plan) in enumerate(zip(xs, dec.input_plans)):
        if plan.steps or x.sbp != sig.inputs[i]:
            y = x._box(sig.inputs[i], placement, reason=f"input {i} of {display} under {sig}", plan=plan)
            boxings.append(y.record)
            boxed.append(y)
        else:
            boxed.append(x)
    outs: dict[int, tuple[torch.Tensor, ...]] = {}
    for r in placement.rank_list:
        local = [b.shards[r] for b in boxed]
        try:
            outs[r] = tuple(op.kernel(local, dec.local_attrs[r]))
        except (RuntimeError, NotImplementedError) as e:  # torch refuses (e.g. a dtype it has no kernel for)
            raise OpError(f"{display}: torch cannot run it on {', '.join(x.name for x in xs)} (local shapes "
                          f"{[tuple(t.shape) for t in local]}, dtypes {[t.dtype for t in local]}): {e}") from e
    out_name = name or _fresh_name()
    shown = display if display == op_name else f"{display} [{op_name}]"
    record = OpRecord(shown, out_name, [x.name for x in xs], [x.sbp for x in xs], dec.candidates[0],
                      dec.candidates[1:], boxings, dec.forced)
    emit(record)
    results = tuple(
        GlobalTensor({r: o[j] for r, o in outs.items()}, placement, sig.outputs[j], m.shape,
                     name=out_name if j == 0 else f"{out_name}.{j}", record=record)
        for j, m in enumerate(dec.out_metas))
    return results[0] if len(results) == 1 else results


def tensor(full: torch.Tensor, placement: Placement, sbp, name: str | None = None) -> GlobalTensor:
    """Make a global tensor from its full value: S takes slices, B copies, P gives rank 0 the value."""
    name = name or _fresh_name()
    need_placement(placement, name)
    try:
        full = torch.as_tensor(full)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputTypeError(f"{name}: sl.tensor needs the full value as a torch.Tensor (or nested lists of "
                             f"numbers), got {type(full).__name__}: {e}") from None
    nd = as_nd_sbp(sbp, placement.ndim, full.ndim, what=name)
    return GlobalTensor(shard(full, placement, nd, what=name), placement, nd, full.shape, name=name)


def need_placement(placement: object, name: str) -> None:
    """A placement argument must be one (a list of ranks is not: sl.Placement says which mesh it is)."""
    if not isinstance(placement, Placement):
        raise InputTypeError(f"{name}: placement must be an sl.Placement such as sl.Placement('cpu', [0, 1]), got "
                             f"{type(placement).__name__}")


def explain(t: GlobalTensor) -> str:
    """How ``t`` was made: its op, the chosen and rejected signatures, every boxing with bytes."""
    if not isinstance(t, GlobalTensor):
        raise InputTypeError(f"explain needs a global tensor (sl.tensor, sl.from_local or an op's result), got "
                             f"{type(t).__name__}")
    lines = [repr(t)]
    rec = t.record
    if rec is None:
        lines.append("  made directly (sl.tensor / sl.from_local); no op or boxing produced it")
    else:
        lines += ["  " + s for s in rec.lines()]
    return "\n".join(lines)
