"""How much of a compiled step DTensor expresses by itself: each ATen op of the training step (forward
and backward, as torch's autograd runs them on DTensors), asked of DTensor's own sharding propagation.

Why op by op: a DTensor program states the layouts of the parameters and of the batch; every op after
that gets the sharding DTensor's rules choose for the layouts that reach it. An sbplab strategy states
a signature per op. The export says the strategy exactly where DTensor's rules, fed the layouts sbplab
gives an op's inputs, choose sbplab's signature (and redistribute the inputs as sbplab's boxing does).

Each op lands in one class (``Coverage.kinds``):
- ``dtensor``: DTensor's propagation does what sbplab does, from the layouts that reach the op;
- ``redistribute``: DTensor accepts sbplab's signature once the inputs are redistributed to it, which it
  would not do by itself (``PrepareModuleInput`` where the input enters a module, an explicit
  ``redistribute`` otherwise);
- ``local_map``: DTensor has no such signature (or no rule for the op): only ``local_map`` with sbplab's
  placements runs the op's kernel on sbplab's shards.

The check runs on a fake process group (``torch.testing``'s FakeStore, no processes, meta tensors):
nothing is computed and no real group is needed, so it also works for meshes this machine does not have.
It assumes each op's inputs arrive as sbplab lays them out (a local verdict per op, not a simulation of
a whole DTensor program whose earlier choices may differ).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..sbp import Broadcast, Partial, Split

KINDS = ("dtensor", "redistribute", "local_map")


@dataclass
class OpVerdict:
    """One op of the step: its class, sbplab's signature and, where DTensor differs, what it picks."""

    op: str
    type: str
    module: str
    kind: str  # one of KINDS
    signature: str  # sbplab's, "in, in -> out"
    dtensor: str = ""  # DTensor's choice, where it is not sbplab's ("" when it agrees; "no rule" when it has none)


@dataclass
class Coverage:
    """Per-op verdicts of a compiled step; ``fraction`` is the share DTensor expresses by itself."""

    strategy: str
    verdicts: list[OpVerdict] = field(default_factory=list)
    skipped: int = 0  # ops that are not ATen ops (sbplab's own optimizer updates, fx-captured ops)

    @property
    def total(self) -> int:
        return len(self.verdicts)

    @property
    def kinds(self) -> Counter:
        return Counter(v.kind for v in self.verdicts)

    @property
    def fraction(self) -> float:
        """Ops DTensor's propagation runs as sbplab does (``dtensor``), over all ATen ops checked."""
        return self.kinds["dtensor"] / self.total if self.total else 0.0

    @property
    def fraction_with_redistributes(self) -> float:
        """Ops expressed once the export adds redistributes (``dtensor`` and ``redistribute``)."""
        return (self.kinds["dtensor"] + self.kinds["redistribute"]) / self.total if self.total else 0.0

    def summary(self, top: int = 8) -> str:
        k = self.kinds
        lines = [f"{self.strategy}: {self.total} ATen ops, DTensor expresses {k['dtensor']} "
                 f"({self.fraction:.0%}) by propagation, {k['redistribute']} more with a redistribute "
                 f"({self.fraction_with_redistributes:.0%}), {k['local_map']} only through local_map"]
        by_type = Counter((v.type, v.kind) for v in self.verdicts if v.kind != "dtensor")
        for (t, kind), n in by_type.most_common(top):
            ex = next(v for v in self.verdicts if v.type == t and v.kind == kind)
            lines.append(f"  {kind}: {n} x {t} (e.g. {ex.op} in {ex.module or 'the model'}: sbplab "
                         f"{ex.signature}, DTensor {ex.dtensor})")
        return "\n".join(lines)


def coverage(step: Any) -> Coverage:
    """The verdict on every ATen op of ``step`` (``sl.compile``); see the module docstring."""
    import torch
    import torch.distributed as dist

    g, d, st = step.graph, step.deduction, step.strategy
    mesh_pl = st.stages[0] if st.stages else st.placement
    out = Coverage(st.name)
    if dist.is_initialized():
        raise RuntimeError("export.coverage runs DTensor's propagation on a fake process group of its own; "
                           "call it before torch.distributed.init_process_group (or in another process)")
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = math.prod(mesh_pl.shape)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = DeviceMesh("cpu", torch.arange(world).reshape(mesh_pl.shape))
        ask = _Asker(mesh)
        for op in g.ops:
            if op.phase not in ("forward", "backward") or "." not in op.type or op.name not in d.choices:
                out.skipped += 1
                continue
            out.verdicts.append(_verdict(op, g, d, ask))
    finally:
        dist.destroy_process_group()
    return out


def arriving(op: Any, d: Any) -> tuple:
    """Each input's layout as it reaches the op: stored, or after a ZeRO use gather (FSDP does that one)."""
    c = d.choices[op.name]
    out = []
    for t, r in zip(op.inputs, c.reads):
        b = d.boxings[r] if r is not None else None
        out.append(b.dst_sbp if b is not None and b.kind == "use" else b.src_sbp if b is not None else d.sbp[t])
    return tuple(out)


def _verdict(op: Any, g: Any, d: Any, ask: _Asker) -> OpVerdict:
    from ..sbp import fmt_sbp

    sig = d.choices[op.name].signature
    v = OpVerdict(op.name, op.type, op.module or "", "local_map", repr(sig))
    metas = [g.tensors[t].meta for t in op.inputs]
    if not metas:  # a factory (arange, full): a plain tensor, which DTensor replicates implicitly
        if all(isinstance(x, Broadcast) for nd in sig.outputs for x in nd):
            v.kind = "dtensor"
        else:
            v.dtensor = "a plain tensor, replicated"
        return v
    try:
        got = ask(op, metas, arriving(op, d))
        if _agrees(got, sig):
            v.kind = "dtensor"
            return v
        v.dtensor = _fmt(got, fmt_sbp)
        direct = ask(op, metas, sig.inputs)
        if _agrees(direct, sig):
            v.kind = "redistribute"
    except _NoRule as e:
        v.dtensor = f"no rule ({e})"
    return v


def _agrees(got: tuple | None, sig: Any) -> bool:
    """DTensor's (inputs, outputs) are sbplab's signature; an output DTensor gives no layout for is one the
    op does not produce here (a convolution's bias gradient without a bias)."""
    if got is None:
        return False
    ins, outs = got
    return ins == tuple(sig.inputs) and all(o is None or o == s for o, s in zip(outs, sig.outputs))


def _fmt(got: tuple | None, fmt_sbp: Any) -> str:
    if got is None:
        return "rejects these layouts"
    ins, outs = got

    def one(nd: Any) -> str:
        if nd is None:
            return "?"
        return "(" + ", ".join(x[1] if isinstance(x, tuple) else fmt_sbp(x) for x in nd) + ")"

    return ", ".join(map(one, ins)) + " -> " + ", ".join(map(one, outs))


class _NoRule(Exception):
    pass


class _Asker:
    """DTensor's choice for an op given its inputs' layouts: (input layouts it runs on, output layouts)."""

    def __init__(self, mesh: Any) -> None:
        from torch.distributed.tensor import DTensor

        self.mesh = mesh
        self.dispatcher = DTensor._op_dispatcher
        self.propagator = self.dispatcher.sharding_propagator

    def _dtensor(self, meta: Any, nd: tuple) -> Any:
        import torch
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        shape = tuple(meta.shape)
        stride = torch.empty(shape, device="meta").stride()
        spec = DTensorSpec(self.mesh, tuple(_to_torch(x) for x in nd),
                           tensor_meta=TensorMeta(torch.Size(shape), stride, meta.dtype))
        return DTensor(torch.empty(shape, dtype=meta.dtype, device="meta"), spec, requires_grad=False)

    def __call__(self, op: Any, metas: list, layouts: tuple) -> tuple | None:
        import torch
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        from torch.utils._pytree import tree_leaves

        from ..ops.aten.calls import fill, resolve

        attrs = dict(op.attrs)
        overload = resolve(attrs.get("op", op.type), attrs.get("lib"))
        ts = [self._dtensor(m, nd) for m, nd in zip(metas, layouts)]
        args = _lists(fill(attrs["args"], ts, torch.device("cpu")))
        kwargs = {k: _lists(v) for k, v in fill(attrs.get("kwargs", ()), ts, torch.device("cpu"))}
        try:
            info = self.dispatcher.unwrap_to_op_info(overload, tuple(args), kwargs)
            self.propagator.propagate(info)
        except NotImplementedError as e:
            raise _NoRule(str(e).splitlines()[0][:80]) from None
        except (RuntimeError, AssertionError, ValueError, IndexError, TypeError):
            return None  # DTensor refuses these layouts for this op
        specs = [x for x in tree_leaves((info.schema.args_schema, info.schema.kwargs_schema))
                 if isinstance(x, DTensorSpec)]
        rs = info.output_sharding.redistribute_schema
        if rs is not None:
            specs = [x for x in tree_leaves((rs.args_schema, rs.kwargs_schema)) if isinstance(x, DTensorSpec)]
        order = [id(x) for x in tree_leaves((args, kwargs)) if hasattr(x, "_spec")]
        if len(specs) != len(order):
            return None
        by_id = dict(zip(order, specs))
        ins = tuple(tuple(_of_torch(p) for p in by_id[id(t)].placements) if id(t) in by_id else nd
                    for t, nd in zip(ts, layouts))
        outs = info.output_sharding.output_spec
        leaves = [outs] if isinstance(outs, DTensorSpec) else list(outs) if isinstance(outs, (tuple, list)) else []
        return ins, tuple(tuple(_of_torch(p) for p in s.placements) if s is not None else None for s in leaves)


def _lists(x: Any) -> Any:
    """sbplab freezes a call's lists into tuples; ATen's schema (and DTensor's rules) want lists."""
    return [_lists(v) for v in x] if isinstance(x, tuple) else x


def _to_torch(x: Any) -> Any:
    from .placements import DTensorPlacement

    return DTensorPlacement.of(x).to_torch()  # a strided split is DTensor's _StridedShard


def _of_torch(p: Any) -> Any:
    from torch.distributed.tensor import Partial as TPartial
    from torch.distributed.tensor import Replicate, Shard

    from ..sbp import B

    if type(p) is Shard:
        return Split(p.dim)
    if type(p).__name__ == "_StridedShard":
        return Split(p.dim, chunks=p.split_factor)
    if type(p).__name__ == "_MaskPartial" and p.reduce_op == "sum":  # a vocabulary-split lookup: masked rows
        return Partial("sum")  # summed, as sbplab's P of the same embedding
    if isinstance(p, Replicate):
        return B
    if type(p) is TPartial and p.reduce_op in ("sum", "max", "min"):
        return Partial(p.reduce_op)
    return ("other", repr(p))  # avg and the rest: nothing sbplab says


def _inside_export(exp: Any):
    """Whether a verdict's op runs inside one of the export's ``local_map`` calls: an attention call the
    export maps (``exp.local_maps``), forward or backward, or an op of a module it runs on its shards
    (``exp.module_maps``)."""
    from .local_maps import TORCH_FUNCTIONS

    modules = [m.module for m in exp.module_maps]
    attention = tuple(t.rsplit(".", 1)[0] for t in TORCH_FUNCTIONS)

    def inside(v: OpVerdict) -> bool:
        if exp.local_maps and v.type.startswith(attention):
            return True
        return any(v.module == m or v.module.startswith(m + ".") for m in modules)

    return inside


def wrapped_by(cov: Coverage, exp: Any) -> tuple[int, int]:
    """(ops the export runs through ``local_map``, ``local_map``-only ops it leaves unexpressed)."""
    inside = _inside_export(exp)
    wrapped = sum(1 for v in cov.verdicts if inside(v))
    left = sum(1 for v in cov.verdicts if v.kind == "local_map" and not inside(v))
    return wrapped, left


def prepared_by(cov: Coverage, exp: Any) -> int:
    """Ops DTensor runs as sbplab does only once their inputs are redistributed (``redistribute``) whose
    every such input the export redistributes where it enters their module (``exp.module_inputs``)."""
    ops = {o for mi in getattr(exp, "module_inputs", ()) for o in mi.ops}
    return sum(1 for v in cov.verdicts if v.kind == "redistribute" and v.op in ops)


def as_sbplab(cov: Coverage, exp: Any) -> float:
    """The share of the step's ATen ops the exported DTensor program runs exactly as sbplab does: by
    DTensor's propagation, after the export's module-input redistributes, or inside its ``local_map``
    calls (on sbplab's shards). The rest DTensor runs by its own choice (or, ``local_map``-only ops the
    export does not wrap, not as sbplab at all)."""
    inside = _inside_export(exp)
    ops = {o for mi in getattr(exp, "module_inputs", ()) for o in mi.ops}
    n = sum(1 for v in cov.verdicts
            if v.kind == "dtensor" or inside(v) or (v.kind == "redistribute" and v.op in ops))
    return n / cov.total if cov.total else 0.0
