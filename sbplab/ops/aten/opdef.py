"""One registry ``OpDef`` per ATen op overload, made on first use from its name.

Shapes come from running the op on meta tensors (so no rule restates torch's shape logic), the
local kernel is the ATen op itself on the shards (with shape arguments localised by the op's rule),
FLOPs come from ``torch.utils.flop_counter`` on meta tensors, and the SBP signatures from the op's
family rule (``rules.py``). A worker process resolves ``"aten.mm.default"`` the same way, so plans
carry only names and argument templates, never user code.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from ...freeze import freeze_attrs
from ..registry import LocalContext, OpDef, TensorMeta
from .calls import call, overload
from .flop_formulas import formula_flops
from .into import into_kernel
from .rules import Rule, rule_for
from .shape_formulas import output_shapes, same_dtype

# a view of the whole tensor may not be a view of a shard (a slice boxing made it non-contiguous); the
# captured graph is functional, so the shard's kernel may copy where a view is impossible
RESHAPES = {"aten.view.default": "aten.reshape.default", "aten._unsafe_view.default": "aten.reshape.default"}
EMPTY = TensorMeta((0,), torch.float32)  # an output the op leaves None (a backward's unused gradient)


def _meta(m: TensorMeta) -> torch.Tensor:
    return torch.empty(m.shape, dtype=m.dtype, device="meta")


@lru_cache(maxsize=1 << 16)
def _infer(name: str, metas: tuple[TensorMeta, ...], frozen: tuple) -> tuple[TensorMeta, ...]:
    shapes = output_shapes(name, metas, dict(frozen))  # the commonest ops by formula (shape_formulas.py)
    if shapes is not None:
        dtypes = [metas[0].dtype] if same_dtype(name) else [m.dtype for m in _infer_kernel(name, _ranks(metas), frozen)]
        return tuple(TensorMeta(sh, dt) for sh, dt in zip(shapes, dtypes))
    return _infer_kernel(name, metas, frozen)


def _ranks(metas: tuple[TensorMeta, ...]) -> tuple[TensorMeta, ...]:
    """The inputs as all-ones shapes of the same ranks: what type promotion reads, cheap to run."""
    return tuple(TensorMeta((1,) * len(m.shape), m.dtype) for m in metas)


@lru_cache(maxsize=1 << 16)
def _infer_kernel(name: str, metas: tuple[TensorMeta, ...], frozen: tuple) -> tuple[TensorMeta, ...]:
    """Output metas from running the op on meta tensors."""
    outs = call(name, dict(frozen), [_meta(m) for m in metas], torch.device("meta"))
    return tuple(EMPTY if o is None else TensorMeta(tuple(o.shape), o.dtype) for o in outs)


@lru_cache(maxsize=4096)
def counts_flops(name: str) -> bool:
    """Whether ``torch.utils.flop_counter`` can count anything for op ``name``: it has a FLOP formula
    (matmuls, convolutions, attention), or a composite decomposition whose parts might. Any other op
    counts zero there (pointwise ops, views, reductions, losses), so it is not run under the counter:
    entering ``FlopCounterMode`` and running the op on meta tensors cost about a millisecond per
    distinct call, most of a GPT's deduction when every op paid it (a 24-layer GPT-2 asks ~1100). Kept per
    name: the answer depends on torch's tables alone."""
    from torch.utils.flop_counter import flop_registry

    try:
        op = overload(name)
    except Exception:  # noqa: BLE001  (a library op this process has not loaded: the counter decides)
        return True
    if op.overloadpacket in flop_registry or op in flop_registry:
        return True
    composite = torch._C.DispatchKey.CompositeImplicitAutograd  # what the counter's ``decompose`` runs
    return composite in op.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), composite)


@lru_cache(maxsize=1 << 14)
def _flops(name: str, metas: tuple[TensorMeta, ...], frozen: tuple) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    attrs = dict(frozen)
    target = attrs.get("op", name)  # the overload the call runs (a rule's localize may swap it)
    if not counts_flops(target):
        return 0
    by_formula = formula_flops(target, rule_for(target).family, metas, attrs, lambda: _infer(name, metas, frozen))
    if by_formula is not None:
        return by_formula
    with FlopCounterMode(display=False) as counter:
        call(name, attrs, [_meta(m) for m in metas], torch.device("meta"))
    return int(counter.get_total_flops())


def _default_device() -> torch.device:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_aten_opdef(name: str) -> OpDef:
    """The ``OpDef`` of ATen (or library custom op) overload ``name``; raises UnknownOpError for an
    unknown ATen name. A library op this process has not loaded yet (a worker's) is resolved when its
    kernel first runs, from the module its captured call names (``attrs["lib"]``)."""
    if name.startswith(("aten.", "prims.")):
        overload(name)
    rule: Rule = rule_for(name)

    def infer(ins: Sequence[TensorMeta], attrs: dict) -> list[TensorMeta]:
        return list(_infer(name, tuple(ins), freeze_attrs(attrs)))

    def signatures(ins: Sequence[TensorMeta], attrs: dict):
        outs = _infer(name, tuple(ins), freeze_attrs(attrs))
        return rule.signatures(list(ins), list(outs), attrs)

    target = RESHAPES.get(name, name)

    def kernel(xs: Sequence[torch.Tensor], attrs: dict):
        device = xs[0].device if xs else _default_device()
        out = call(target, attrs, list(xs), device)
        return tuple(torch.empty(0, device=device) if o is None else o for o in out)

    def flops(ins: Sequence[TensorMeta], outs: Sequence[TensorMeta], attrs: dict) -> int:
        try:
            return _flops(name, tuple(ins), freeze_attrs(attrs))
        except Exception:  # noqa: BLE001  (a custom op without a meta kernel: count nothing)
            return 0

    def localize(attrs: dict, ctx: LocalContext) -> dict:
        return rule.localize(attrs, ctx) if rule.localize is not None else attrs

    op = OpDef(name, infer, signatures, kernel, doc=f"{rule.family}: {rule.note}".strip())
    if rule.localize is not None or counts_flops(name):  # else the registry's zero: no shard worked out
        op.flops = flops
    if rule.localize is not None:
        op.localize = localize
    op.kernel_into = into_kernel(name)  # a gradient written straight into its bucket (into.py)
    return op
