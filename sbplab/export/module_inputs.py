"""``PrepareModuleInput`` per module: where sbplab's ops read a module's input in another layout than the one
that arrives, the export redistributes it as it enters the module, as a DTensor user writes
``PrepareModuleInput(input_layouts=..., desired_input_layouts=...)``.

Why at module entry: DTensor's propagation picks each op's sharding from the layouts that reach it, and
where several are valid it may keep the arriving one (a ReLU on a replicated activation stays
replicated, where sbplab slices it over the batch). A redistribute where the tensor enters the module
that reads it makes DTensor run that op as sbplab does; the redistribute's backward is DTensor's own, so
gradients need nothing more. Only a module's own inputs can be prepared this way: a layout change between
two ops inside one module (BatchNorm's statistics) stays DTensor's choice, and ``coverage`` still counts
it as such.

A module input qualifies when every forward op reading it in that module (nested ones included) reads
it in the same layout, that layout differs from the one sbplab stores it in, and DTensor can redistribute
to it (no partial and no strided split: a partial is made by ops, not by a redistribute); the root module,
modules the export already runs through ``local_map``, and attention calls (``local_map`` redistributes
their inputs itself) are left out. ``apply`` finds the argument by its global shape, among the DTensors
the module is called with, so a module taking two inputs of one shape gets no hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..sbp import Partial, Split
from .coverage import arriving
from .placements import DTensorPlacement, placements_of


@dataclass(frozen=True)
class ModuleInput:
    """Redistribute the DTensor of global ``shape`` that ``module`` is called with to ``placements``;
    ``ops`` are the forward ops that then run as sbplab does (all their inputs arrive in its layout)."""

    module: str
    shape: tuple[int, ...]
    placements: tuple[DTensorPlacement, ...]
    ops: tuple[str, ...]
    tensor: str  # the graph tensor, for the description

    def describe(self) -> str:
        return (f"{self.module}: input {self.tensor} {list(self.shape)} redistributed to "
                f"[{', '.join(map(repr, self.placements))}] as it enters (PrepareModuleInput)")


def _inside(module: str, m: str) -> bool:
    return module == m or module.startswith(m + ".")


def _redistributable(nd: tuple) -> bool:
    return not any(isinstance(x, Partial) or (isinstance(x, Split) and x.chunks > 1) for x in nd)


def module_inputs(g: Any, d: Any, skip_modules: list[str], skip_types: tuple[str, ...]) -> list[ModuleInput]:
    """The module inputs to prepare (see the module docstring), in forward order."""
    fwd = [op for op in g.ops_in("forward") if op.name in d.choices]
    made_in = {t: op.module or "" for op in fwd for t in op.outputs}
    # (module, tensor) -> {layout read} over every reader inside the module; the modules a tensor enters
    reads: dict[tuple[str, str], set[tuple]] = {}
    readers: dict[tuple[str, str], list] = {}
    for op in fwd:
        if not op.module or op.type in skip_types or any(_inside(op.module, m) for m in skip_modules):
            continue
        sig = d.choices[op.name].signature
        parts = op.module.split(".")
        for i, t in enumerate(op.inputs):
            if t in g.params:
                continue
            src = made_in.get(t, "")
            for n in range(1, len(parts) + 1):  # every module enclosing the op that t enters from outside
                m = ".".join(parts[:n])
                if src and _inside(src, m):
                    continue
                reads.setdefault((m, t), set()).add(tuple(sig.inputs[i]))
                readers.setdefault((m, t), []).append((op, i))
    cands: dict[tuple[str, str], tuple] = {}  # (module, tensor) -> the layout to prepare
    for (m, t), layouts in reads.items():
        if len(layouts) != 1:
            continue
        (want,) = layouts
        op, i = readers[(m, t)][0]
        if want != arriving(op, d)[i] and _redistributable(want):
            cands[(m, t)] = want
    # the outermost qualifying module prepares t for every reader inside it
    chosen = {(m, t): w for (m, t), w in cands.items()
              if not any(t2 == t and m2 != m and _inside(m, m2) for m2, t2 in cands)}
    out = []
    for (m, t), want in chosen.items():
        shape = tuple(g.tensors[t].meta.shape)
        if any(m2 == m and t2 != t and tuple(g.tensors[t2].meta.shape) == shape for m2, t2 in reads):
            continue  # another input of the module has this shape: the argument could not be told apart
        out.append(ModuleInput(m, shape, placements_of(want), (), t))
    # an op runs as sbplab does once every input whose layout it changes arrives prepared
    prepared = {(mi.tensor, mi.module) for mi in out}
    final = []
    for mi in out:
        ops = []
        for op, _i in readers[(mi.module, mi.tensor)]:
            ok = True
            for j, u in enumerate(op.inputs):
                if tuple(d.choices[op.name].signature.inputs[j]) == arriving(op, d)[j]:
                    continue
                if not any(u == pt and _inside(op.module, pm) for pt, pm in prepared):
                    ok = False
            if ok and op.name not in ops:
                ops.append(op.name)
        final.append(ModuleInput(mi.module, mi.shape, mi.placements, tuple(ops), mi.tensor))
    order = {op.name: k for k, op in enumerate(fwd)}
    return sorted(final, key=lambda mi: min(order[op.name] for op, _ in readers[(mi.module, mi.tensor)]))


def install_inputs(module: Any, device_mesh: Any, inputs: list[ModuleInput]) -> None:
    """A forward pre-hook per prepared module: the DTensor argument of the recorded global shape is
    redistributed to its placements (positional and keyword arguments alike)."""
    by_module: dict[str, list[ModuleInput]] = {}
    for mi in inputs:
        by_module.setdefault(mi.module, []).append(mi)
    for name, mis in by_module.items():
        wants = {mi.shape: [p.to_torch() for p in mi.placements] for mi in mis}

        def hook(_m: Any, args: tuple, kwargs: dict, wants: dict = wants) -> tuple:
            from torch.distributed.tensor import DTensor

            def prep(x: Any) -> Any:
                if isinstance(x, DTensor) and tuple(x.shape) in wants:
                    want = wants[tuple(x.shape)]
                    if list(x.placements) != want:
                        return x.redistribute(device_mesh, want)
                return x

            return tuple(prep(a) for a in args), {k: prep(v) for k, v in kwargs.items()}

        module.get_submodule(name).register_forward_pre_hook(hook, with_kwargs=True)


__all__ = ["ModuleInput", "install_inputs", "module_inputs"]
