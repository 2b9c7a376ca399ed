"""SBP rules by op family, declared in one place: which ATen ops each family covers.

A rule gives an op's 1-D signatures (the registry adds all-B and builds n-D products) and, where a
shard needs other arguments than the whole op (a view's target shape, an arange's range), how to
localise them. The local kernel is always the ATen op itself. An op with no rule still runs,
replicated (only all-B), and the capture warns with its name and module; ``sl.register_rule`` adds
a rule from user code. Rules run only where a step is compiled: the physical graph carries each
rank's localised arguments, so workers need nothing but torch (and the library that defines a custom
op).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ...sbp import B, Partial
from ..registry import REGISTRY, LocalContext, Signature, TensorMeta, forget_cached_answers
from . import family_factory as fac
from . import family_linalg as la
from . import family_nn as nn
from . import family_random as rnd
from . import family_reduce as red
from . import family_shape as sh
from . import vocab_parallel as vp
from ._common import arg, norm_dim, sized
from .calls import overload
from .family_pointwise import POINTWISE_OPS, pointwise_signatures, triangle_signatures

SigFn = Callable[[str, list[TensorMeta], list[TensorMeta], dict], list[Signature]]
LocalizeFn = Callable[[dict, LocalContext], dict]


@dataclass(frozen=True)
class Rule:
    """An op's SBP rule: ``signatures(ins, outs, attrs)``, optional ``localize``, and its family."""

    family: str
    sig_fn: SigFn
    name: str = ""
    localize: LocalizeFn | None = None
    note: str = ""

    def signatures(self, ins: list[TensorMeta], outs: list[TensorMeta], attrs: dict) -> list[Signature]:
        sigs = self.sig_fn(self.name, ins, outs, attrs)
        dtype = dict(attrs.get("kwargs", ())).get("dtype")
        if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:  # a cast to integers is not linear
            sigs = [s for s in sigs if not (any(isinstance(x, Partial) for x in s.inputs)
                                            and any(isinstance(x, Partial) for x in s.outputs))]
        empty = [m.numel == 0 for m in outs]
        if any(empty):  # outputs the op leaves None are placeholders: never split
            sigs = [Signature(s.inputs, tuple(B if e else x for x, e in zip(s.outputs, empty))) for s in sigs]
        return sigs


RULES: dict[str, Rule] = {}


def declare(family: str, names: Iterable[str], sig_fn: SigFn, localize: Callable[[str], LocalizeFn] | None = None,
            note: str = "") -> None:
    """One family's rule for each op in ``names`` (``localize(name)`` makes the op's localize)."""
    for n in names:
        RULES[n] = Rule(family, sig_fn, n, localize(n) if localize else None, note)


def register_rule(op: str, signatures: Callable[[list[TensorMeta], list[TensorMeta], dict], list[Signature]],
                  localize: LocalizeFn | None = None, family: str = "user") -> None:
    """Give ATen or custom op ``op`` (``"aten.foo.default"``, ``"mylib.op.default"``) an SBP rule.

    ``signatures(in_metas, out_metas, attrs)`` returns 1-D ``sl.Signature``s (all-B is always added);
    ``attrs["args"]`` is the call with tensors as ``Slot``s. ``localize(attrs, ctx)`` rewrites the
    arguments for one shard when they depend on it. Workers need no copy of the rule: each rank's
    arguments are localised when the step is compiled.
    """
    overload(op)
    RULES[op] = Rule(family, lambda name, ins, outs, attrs: signatures(ins, outs, attrs), op, localize)
    forget(op)


def forget(op: str) -> None:
    """Drop ``op``'s OpDef and every answer cached from its old rule (signatures, scores, FLOPs)."""
    REGISTRY.pop(op, None)  # made again, with the rule now declared
    forget_cached_answers()


def _replicated(name: str, ins: list, outs: list, attrs: dict) -> list[Signature]:
    return []


def rule_for(name: str) -> Rule:
    """The declared rule, else pointwise for ops torch tags pointwise, else replicated."""
    if name in RULES:
        return RULES[name]
    if name.startswith("aten.") and torch.Tag.pointwise in overload(name).tags:
        return Rule("pointwise", pointwise_signatures, name)
    return Rule("replicated", _replicated, name, note="no rule: runs whole on every rank")


def has_rule(name: str) -> bool:
    return rule_for(name).family != "replicated"


def _ops(*names: str) -> list[str]:
    return [f"aten.{n}" for n in names]


# --- pointwise (torch's pointwise tag covers the rest) ------------------------------------------
declare("pointwise", POINTWISE_OPS, pointwise_signatures, note="broadcasting dims split together; linear ops pass P")
declare("random", rnd.RANDOM_OPS, rnd.random_signatures, rnd.random_localize,
        note="each op its own stream, drawn over the global shape: every strategy the same numbers")

# --- reductions and ops along one dim -------------------------------------------------------
declare("reduction", _ops("sum.dim_IntList", "sum.default", "amax.default", "amin.default", "argmax.default",
                          "argmin.default", "any.dim", "any.dims", "all.dim", "prod.dim_int", "max.dim",
                          "min.dim"), red.reduce_signatures)
declare("reduction", _ops("histc.default"), red.histc_signatures)
declare("along-dim", _ops("_softmax.default", "_log_softmax.default", "_safe_softmax.default", "sort.default",
                          "cumsum.default"),
        lambda n, i, o, a: red.along_dim_signatures(n, i, o, a, 1, 0 if n == "aten.cumsum.default" else None))
declare("along-dim", _ops("topk.default"), lambda n, i, o, a: red.along_dim_signatures(n, i, o, a, 2))
declare("along-dim", _ops("_softmax_backward_data.default", "_log_softmax_backward_data.default"),
        lambda n, i, o, a: red.along_dim_signatures(n, i, o, a, 2, 0))

# --- shape ops: dim maps ----------------------------------------------------------------------
declare("shape", _ops("view.default", "_unsafe_view.default", "reshape.default"),
        lambda n, i, o, a: sh.reshape_signatures(i, o), lambda n: sized(1, "size"))
declare("shape", _ops("squeeze.dim", "squeeze.dims", "squeeze.default", "unsqueeze.default", "flatten.using_ints"),
        lambda n, i, o, a: sh.reshape_signatures(i, o))
declare("shape", _ops("expand.default"), lambda n, i, o, a: sh.expand_signatures(i, o), lambda n: sized(1, "size"))
declare("shape", _ops("permute.default", "transpose.int", "t.default"),
        lambda n, i, o, a: sh.dim_map_signatures(i, o, sh.permute_map(n, i, a)))
declare("shape", _ops("select.int", "unbind.int"), lambda n, i, o, a: sh.dim_map_signatures(
    i, o, sh.drop_dim_map(len(i[0].shape), norm_dim(arg(a, 1, "dim", 0), len(i[0].shape)))))
declare("shape", _ops("slice.Tensor", "narrow.default"),
        lambda n, i, o, a: sh.dim_map_signatures(i, o, sh.slice_map(n, i, a)))
declare("shape", _ops("split.Tensor", "split_with_sizes.default"), sh.split_signatures, sh.split_localize,
        note="a strided split S(d, chunks=k) cut into its k chunks is a plain split of each")
declare("shape", _ops("slice_backward.default", "select_backward.default"),
        lambda n, i, o, a: sh.dim_map_signatures(i, o, {d: o_ for o_, d in sh.drop_dim_map(
            len(o[0].shape), norm_dim(arg(a, 2, "dim"), len(o[0].shape))).items()} if n.startswith("aten.select")
            else sh.keep_other_dims(len(o[0].shape), norm_dim(arg(a, 2, "dim"), len(o[0].shape)))),
        lambda n: sized(1, "input_sizes"))
declare("shape", _ops("cat.default"), lambda n, i, o, a: sh.cat_signatures(i, o, a))
declare("shape", _ops("stack.default"), lambda n, i, o, a: sh.stack_signatures(i, o, a))
declare("shape", _ops("constant_pad_nd.default"), lambda n, i, o, a: sh.pad_signatures(i, o, a))

# --- matmul family ----------------------------------------------------------------------------
declare("matmul", _ops("mm.default"), lambda n, i, o, a: la.mm_signatures(i, o))
declare("matmul", _ops("bmm.default"), lambda n, i, o, a: la.bmm_signatures(i, o))
declare("matmul", _ops("matmul.default"), lambda n, i, o, a: la.batched_matmul_signatures(i, o))
declare("matmul", _ops("addmm.default", "baddbmm.default"), lambda n, i, o, a: la.addmm_signatures(i, o))

# --- layers -----------------------------------------------------------------------------------
declare("norm", _ops("native_layer_norm.default"), lambda n, i, o, a: nn.layer_norm_signatures(i, o, a))
declare("norm", _ops("native_layer_norm_backward.default"),
        lambda n, i, o, a: nn.layer_norm_backward_signatures(i, o, a))
declare("attention", _ops(
    "_scaled_dot_product_flash_attention_for_cpu.default", "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "_scaled_dot_product_flash_attention.default", "_scaled_dot_product_flash_attention_backward.default",
    "_scaled_dot_product_efficient_attention.default", "_scaled_dot_product_efficient_attention_backward.default",
    "_scaled_dot_product_cudnn_attention.default", "_scaled_dot_product_cudnn_attention_backward.default",
), lambda n, i, o, a: nn.attention_signatures(i, o), note="batch and heads split")
declare("attention", ["sbplab.scaled_dot_product_attention.default", "sbplab.scaled_dot_product_attention_backward.default"],
        lambda n, i, o, a: nn.fused_attention_signatures(i, o, n.endswith("backward.default")),
        note="batch and heads split; the kernel is the device's (ops/aten/attention.py)")
VOCAB = "weight rows split by vocabulary: a masked lookup, each rank its rows' gradient (vocab_parallel.py)"
declare("embedding", _ops("embedding.default"), lambda n, i, o, a: nn.embedding_signatures(i, o),
        vp.embedding_localize, note=VOCAB)
declare("embedding", _ops("embedding_dense_backward.default"), lambda n, i, o, a: nn.embedding_backward_signatures(i, o, a),
        vp.embedding_backward_localize, note=VOCAB)
declare("pointwise", ["sbplab.log_saving_output.default"], pointwise_signatures)
declare("pointwise", _ops("triu.default", "tril.default"), lambda n, i, o, a: triangle_signatures(i, o),
        note="the last two dims whole, leading dims split; linear")
declare("indexing", ["sbplab.pick_logit.default"], vp.pick_signatures, vp.pick_localize,
        note="the target's logit; on logits split by vocabulary a partial sum (vocab_parallel.py)")
declare("indexing", ["sbplab.pick_logit_backward.default"], vp.pick_backward_signatures, vp.pick_backward_localize,
        note="each rank writes its vocabulary columns of the gradient (vocab_parallel.py)")
declare("loss", ["sbplab.cross_entropy_rows.default", "sbplab.cross_entropy_rows_backward.default"],
        lambda n, i, o, a: nn.cross_entropy_rows_signatures(n, i, o),
        note="rows split together; the fused backward holds one logits-sized buffer (cross_entropy_rows.py)")
declare("indexing", _ops("gather.default", "scatter.value", "scatter.src", "scatter_add.default"),
        lambda n, i, o, a: nn.gather_signatures(i, o, a, n == "aten.gather.default"))
declare("indexing", _ops("index.Tensor"), lambda n, i, o, a: nn.index_signatures(i, o, a))
declare("indexing", _ops("index_put.default"), lambda n, i, o, a: nn.index_put_signatures(i, o, a))
declare("conv", _ops("convolution.default"), lambda n, i, o, a: nn.conv_signatures(i, o, a))
declare("conv", _ops("convolution_backward.default"), lambda n, i, o, a: nn.conv_backward_signatures(i, o, a),
        lambda n: nn.conv_backward_localize)
declare("pooling", _ops("max_pool2d_with_indices.default", "max_pool2d_with_indices_backward.default",
                        "avg_pool2d.default", "avg_pool2d_backward.default", "_adaptive_avg_pool2d.default",
                        "_adaptive_avg_pool2d_backward.default"),
        lambda n, i, o, a: nn.channels_signatures(i, o) + nn.pool_linear_signatures(n, i, o),
        note="batch or channels split; averages and every backward are linear in their first input")

# --- factories --------------------------------------------------------------------------------
declare("factory", _ops("full.default", "zeros.default", "ones.default", "empty.memory_format"),
        lambda n, i, o, a: fac.factory_signatures(i, o), lambda n: sized(0, "size"))
declare("factory", _ops("new_zeros.default", "new_ones.default", "new_empty.default", "new_full.default"),
        lambda n, i, o, a: fac.factory_signatures(i, o), lambda n: sized(1, "size"))
declare("factory", _ops("scalar_tensor.default"), lambda n, i, o, a: [])  # a 0-d constant: B
declare("factory", _ops("arange.default", "arange.start", "arange.start_step"),
        lambda n, i, o, a: fac.factory_signatures(i, o), fac.arange_localize)
