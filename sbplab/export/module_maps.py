"""What the export does at module boundaries, where DTensor's op-by-op propagation alone goes wrong:

- ``ModuleOutput``: a redistribute of a module's output to the layout sbplab's consumers read it in
  (``PrepareModuleOutput``'s job). A vocabulary-split embedding leaves DTensor a ``_MaskPartial``
  output whose mask is released by the first reduction, so a second consumer (Llama's residual and its
  RMSNorm) fails, and a transpose before the reduction (an LSTM's ``batch_first``) breaks the mask's
  shape; reducing once at the module's output, as torchtitan's ``RowwiseParallel(output_layouts=...)``
  does, is what a DTensor user writes.
- ``ModuleLocalMap``: a whole module run through ``local_map`` on its shards, where DTensor has no rule
  for its kernels (the fused RNN kernels on CPU; MoE experts' ``grouped_mm``, which DTensor propagates
  only in bf16) or its rule is wrong for sbplab's layout (a convolution meeting a channel-split input).
  A module of one op (a convolution) runs with sbplab's signature for that op; a larger one (an RNN, an
  experts block) with its rows split over the data axes and everything else replicated, which is valid
  for any module that computes each batch row (each token) on its own.

Each is found on the compiled step's graph (module paths of the captured ops); ``apply`` installs them
as forward hooks (outputs) and as a wrapped ``forward`` (local maps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..sbp import Broadcast, Partial, Split
from .placements import DTensorPlacement, placements_of

RNN_WEIGHT = "weight_ih_l0"  # nn.RNN / nn.LSTM / nn.GRU's first parameter: the module is an RNN
RNN_WHY = "DTensor has no rule for the fused RNN kernels: the batch split over data axes, the rest whole"
MOE_WHY = ("DTensor propagates grouped_mm only in bf16 (its meta function): the experts on their tokens, "
           "split over data axes, the rest whole")


@dataclass(frozen=True)
class ModuleOutput:
    """Redistribute ``module``'s (single tensor) output to ``placements`` right where it leaves."""

    module: str
    placements: tuple[DTensorPlacement, ...]
    why: str

    def describe(self) -> str:
        return f"{self.module}: output redistributed to [{', '.join(map(repr, self.placements))}] ({self.why})"


@dataclass(frozen=True)
class ModuleLocalMap:
    """Run ``module`` on local shards: its tensor inputs (in forward order), its parameters and its outputs
    (global shapes, to match the local results) with these placements; gradients as ``*_grads`` say."""

    module: str
    inputs: tuple[tuple[DTensorPlacement, ...], ...]
    input_grads: tuple[tuple[DTensorPlacement, ...], ...]
    params: dict[str, tuple[DTensorPlacement, ...]]  # name relative to the module -> placements
    param_grads: dict[str, tuple[DTensorPlacement, ...]]
    outputs: tuple[tuple[tuple[int, ...], tuple[DTensorPlacement, ...]], ...]  # (global shape, placements)
    why: str

    def describe(self) -> str:
        ins = ", ".join("[" + ", ".join(map(repr, p)) + "]" for p in self.inputs)
        ps = ", ".join(f"{n}: [{', '.join(map(repr, p))}]" for n, p in self.params.items())
        outs = ", ".join("[" + ", ".join(map(repr, p)) + "]" for _, p in self.outputs)
        return f"{self.module}: local_map(forward, inputs ({ins}), parameters ({ps}) -> ({outs})) ({self.why})"


def _module_ops(g: Any, module: str) -> list:
    return [op for op in g.ops_in("forward") if op.module == module or (op.module or "").startswith(module + ".")]


def _boundary(g: Any, module: str) -> tuple[list[str], list[str], list[str]]:
    """(tensor inputs from outside in order of first use, the module's parameters, outputs used outside)."""
    ops = _module_ops(g, module)
    made = {t for op in ops for t in op.outputs}
    names = {op.name for op in ops}
    ins: list[str] = []
    params: list[str] = []
    for op in ops:
        for t in op.inputs:
            if t in made:
                continue
            if t in g.params:
                if t.startswith(module + ".") and t not in params:
                    params.append(t)
            elif t not in ins:
                ins.append(t)
    used_outside = {t for op in g.ops_in("forward") if op.name not in names for t in op.inputs}
    outs = [t for op in ops for t in op.outputs if t in used_outside or t in getattr(g, "outputs", ())]
    return ins, params, outs


def _first_read(g: Any, d: Any, t: str) -> tuple | None:
    """The layout the first forward consumer of ``t`` reads it in (its signature, after sbplab's boxing)."""
    for op in g.ops_in("forward"):
        if t in op.inputs and op.name in d.choices:
            return tuple(d.choices[op.name].signature.inputs[op.inputs.index(t)])
    return None


def module_outputs(g: Any, d: Any) -> list[ModuleOutput]:
    """Embeddings split over the vocabulary: their output reduced once, to what sbplab's consumer reads."""
    from ..sbp import B

    out = []
    for op in g.ops_in("forward"):
        if op.type not in ("aten.embedding.default", "embedding") or not op.module:
            continue
        w = op.inputs[0] if op.type == "aten.embedding.default" else op.inputs[1]
        if w not in g.params or not any(isinstance(x, Split) and x.dim == 0 for x in d.sbp[w]):
            continue
        read = _first_read(g, d, op.outputs[0]) or tuple(B for _ in d.sbp[w])
        # a consumer reading it still partial would hand DTensor the masked partial again: reduce it
        read = tuple(B if isinstance(x, Partial) else x for x in read)
        out.append(ModuleOutput(op.module, placements_of(read), "a vocabulary-split embedding's masked "
                                                                  "partial sum, reduced once"))
    return out


def _grad_of(nd: tuple, others: list[tuple]) -> tuple:
    """SBP's duality: a split input's gradient is split alike, a partial one's replicated, a replicated
    one's partial on every axis where the computation is split (else replicated)."""
    out = []
    for a, x in enumerate(nd):
        if isinstance(x, Split):
            out.append(x)
        elif isinstance(x, Partial):
            out.append(Broadcast())
        else:
            split = any(not isinstance(o[a], Broadcast) for o in others)
            out.append(Partial("sum") if split else Broadcast())
    return tuple(out)


def module_local_maps(g: Any, d: Any) -> list[ModuleLocalMap]:
    """RNN modules, MoE experts (``grouped_mm``), and convolution modules whose layout is more than a batch
    split over one mesh axis."""
    out = []
    seen: set[str] = set()
    rows = [(p.rpartition(".")[0], RNN_WHY) for p in g.params if p.rpartition(".")[2] == RNN_WEIGHT]
    rows += [(op.module, MOE_WHY) for op in g.ops_in("forward") if "grouped_mm" in op.type and op.module]
    for module, why in rows:
        if module not in seen:
            seen.add(module)
            lm = _batch_local_map(g, d, module, why)
            if lm is not None:
                out.append(lm)
    for op in g.ops_in("forward"):
        if not op.type.startswith("aten.convolution") or not op.module or op.module in seen:
            continue
        ins, params, outs = _boundary(g, op.module)
        sig = d.choices[op.name].signature if op.name in d.choices else None
        if sig is None or len(_module_ops(g, op.module)) != 1 or len(outs) != 1:
            continue
        if _batch_on_one_axis(list(sig.inputs) + list(sig.outputs)):
            continue  # DTensor's rule runs a convolution whose batch is split over one mesh axis
        seen.add(op.module)
        by_name = dict(zip(op.inputs, sig.inputs))
        layouts = [tuple(nd) for nd in sig.inputs] + [tuple(sig.outputs[0])]
        out.append(ModuleLocalMap(
            op.module, tuple(placements_of(by_name[t]) for t in ins),
            tuple(placements_of(_grad_of(by_name[t], layouts)) for t in ins),
            {t[len(op.module) + 1:]: placements_of(by_name[t]) for t in params},
            {t[len(op.module) + 1:]: placements_of(_grad_of(by_name[t], layouts)) for t in params},
            ((tuple(g.tensors[outs[0]].meta.shape), placements_of(sig.outputs[0])),),
            "DTensor's convolution rule lets a channel split reach the kernel for this layout (a channel-split "
            "input, or the batch split over two mesh axes): sbplab's signature on the shards"))
    return out


def _batch_on_one_axis(layouts: list) -> bool:
    """Every tensor whole or split over its first dim (the batch), on at most one mesh axis in all."""
    axes = {a for nd in layouts for a, x in enumerate(nd) if not isinstance(x, Broadcast)}
    return len(axes) <= 1 and all(isinstance(x, Broadcast) or (isinstance(x, Split) and x.dim == 0)
                                  for nd in layouts for x in nd)


def _batch_local_map(g: Any, d: Any, module: str, why: str) -> ModuleLocalMap | None:
    """A module whose rows (batch, or tokens) are computed independently: on each mesh axis where every
    input is split (over the batch), keep that split and split the outputs alike (on the dim sbplab splits
    them, else the inputs' dim); elsewhere run it whole (parameters replicated)."""
    from ..sbp import B

    ins, params, outs = _boundary(g, module)
    if not ins or not outs or not params:
        return None
    ndim = len(d.sbp[params[0]])
    keep = [all(isinstance(d.sbp[t][a], Split) for t in ins) for a in range(ndim)]

    def lay(t: str) -> tuple:
        out = []
        for a in range(ndim):
            x = d.sbp[t][a]
            out.append(B if not keep[a] else x if isinstance(x, Split) else d.sbp[ins[0]][a])
        return tuple(out)

    layouts = [lay(t) for t in ins + outs]
    rep = tuple(B for _ in range(ndim))
    return ModuleLocalMap(
        module, tuple(placements_of(lay(t)) for t in ins), tuple(placements_of(lay(t)) for t in ins),
        {t[len(module) + 1:]: placements_of(rep) for t in params},
        {t[len(module) + 1:]: placements_of(_grad_of(rep, layouts)) for t in params},
        tuple((tuple(g.tensors[t].meta.shape), placements_of(lay(t))) for t in outs), why)


def install(module: Any, device_mesh: Any, outputs: list[ModuleOutput], maps: list[ModuleLocalMap]) -> None:
    """Forward hooks for ``outputs``, a wrapped ``forward`` for ``maps``, on the submodules they name."""
    for mo in outputs:
        placements = [p.to_torch() for p in mo.placements]

        def hook(_m: Any, _args: Any, out: Any, placements: list = placements) -> Any:
            from torch.distributed.tensor import DTensor

            if not isinstance(out, DTensor):
                return out
            out = out.redistribute(device_mesh, placements)
            if out.requires_grad:  # DTensor cannot turn a partial gradient back into the masked partial
                out.register_hook(_reduced)
            return out

        module.get_submodule(mo.module).register_forward_hook(hook)
    for lm in maps:
        sub = module.get_submodule(lm.module)
        sub.forward = _local_forward(sub, sub.forward, lm, device_mesh)


def _reduced(grad: Any) -> Any:
    """A gradient with its partial sums reduced (replicated on those mesh axes)."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(grad, DTensor) or not any(p.is_partial() for p in grad.placements):
        return grad
    return grad.redistribute(grad.device_mesh, [Replicate() if p.is_partial() else p for p in grad.placements])


def _local_forward(sub: Any, forward: Any, lm: ModuleLocalMap, mesh: Any) -> Any:
    """``forward`` on this rank's shards: DTensor inputs and parameters redistributed to ``lm``'s
    placements and made local (their gradients declared, as local_map's ``in_grad_placements`` does),
    the module run with the local parameters (``torch.func.functional_call``), and each output whose
    local shape matches one of ``lm.outputs`` made a DTensor again; an output the step never reads (an
    LSTM's final state) comes back as this rank's local tensor."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate
    from torch.utils._pytree import tree_flatten, tree_unflatten

    def local(t: Any, pl: tuple, grad: tuple) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if not isinstance(t, DTensor):  # a plain tensor is whole and the same on every rank
            t = DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)
        return t.redistribute(mesh, [p.to_torch() for p in pl]).to_local(
            grad_placements=[p.to_torch() for p in grad])

    def run(*args: Any, **kwargs: Any) -> Any:
        flat, spec = tree_flatten((args, kwargs))
        k = 0
        for i, t in enumerate(flat):
            if isinstance(t, torch.Tensor) and k < len(lm.inputs):
                flat[i] = local(t, lm.inputs[k], lm.input_grads[k])
                k += 1
        args, kwargs = tree_unflatten(flat, spec)
        params = {n: local(p, lm.params[n], lm.param_grads[n]) for n, p in sub.named_parameters()
                  if n in lm.params}
        sub.forward = forward  # functional_call calls the module: run the original forward inside
        try:
            out = torch.func.functional_call(sub, params, args, kwargs)
        finally:
            sub.forward = run
        leaves, ospec = tree_flatten(out)
        free = list(lm.outputs)
        for i, t in enumerate(leaves):
            if not isinstance(t, torch.Tensor):
                continue
            for j, (shape, pl) in enumerate(free):
                placements = [p.to_torch() for p in pl]
                if _local_shape(shape, mesh, placements) == tuple(t.shape):
                    leaves[i] = DTensor.from_local(t, mesh, placements, run_check=False, shape=torch.Size(shape),
                                                   stride=torch.empty(shape, device="meta").stride())
                    free.pop(j)
                    break
        return tree_unflatten(leaves, ospec)

    return run


def _local_shape(shape: tuple, mesh: Any, placements: list) -> tuple:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return tuple(compute_local_shape_and_global_offset(shape, mesh, placements)[0])


__all__ = ["ModuleLocalMap", "ModuleOutput", "install", "module_local_maps", "module_outputs"]
