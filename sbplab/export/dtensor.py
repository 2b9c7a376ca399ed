"""Export a compiled step to PyTorch DTensor: the mesh, each parameter's placements, a plan.

    import sbplab.export
    exp = sbplab.export.to_dtensor(step)        # step = sl.compile(..., strategy=sl.presets.tensor_parallel(2))
    exp.placements["blocks.0.fc1.weight"]      # (Shard(0),)
    exp.plan                                   # {"blocks.0.fc1": "ColwiseParallel()", ...}
    print(exp.code())                          # the torch a user would write
    model = exp.apply(model, device_mesh)      # inside torch.distributed, on every rank

How a strategy maps (``mode``):
- ``parallelize_module``: Megatron on a 1-D mesh; column layers ``ColwiseParallel``, row layers
  ``RowwiseParallel``, everything else plain and replicated (inputs are whole on every rank).
- ``distribute``: every parameter becomes a DTensor with exactly sbplab's placements, and the batch
  too (``shard_batch``); DTensor's propagation then runs the same collectives. Data parallel and
  DP x TP on a 2-D mesh take this road (``plan`` still lists the ParallelStyle of each TP layer).
- ``fully_shard``: ZeRO on a 1-D mesh is FSDP2; stage 3 reshards after forward, stage 2 does not.
Where sbplab's ops read a module's input in another layout than the one that arrives, it is redistributed
as it enters the module (``module_inputs``: ``PrepareModuleInput``'s job). Ops with no DTensor rule (CPU attention) run through ``local_map`` with sbplab's placements
(``local_maps``; ``with exp.running():`` around forward and backward); ``sbplab.export.coverage(step)``
says, op by op, which ops DTensor's own propagation runs as sbplab does. Tied weights (an LM head sharing
the embedding) stay one DTensor under both names. What DTensor cannot say is listed in ``unsupported``: pipeline stages (``torch.distributed.pipelining``
with the stage cuts given), signature hints, gradient accumulation, uneven splits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..sbp import Split
from .local_maps import TORCH_FUNCTIONS, LocalMapCall, local_map_calls
from .module_inputs import ModuleInput, module_inputs
from .module_maps import ModuleLocalMap, ModuleOutput, module_local_maps, module_outputs
from .placements import DTensorPlacement, placements_of

MODES = ("parallelize_module", "distribute", "fully_shard", "pipeline")


@dataclass
class DTensorExport:
    """A strategy in DTensor's terms; see the module docstring for what each field means."""

    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...]
    device_type: str
    placements: dict[str, tuple[DTensorPlacement, ...]]  # parameter -> one placement per mesh axis
    input_placements: dict[str, tuple[DTensorPlacement, ...]]  # graph input (batch, target) -> placements
    plan: dict[str, str]  # module path -> ParallelStyle, for parallelize_module on the tp axis
    mode: str
    unsupported: list[str] = field(default_factory=list)  # what DTensor cannot express, and what to use
    tp_dim: str | None = None  # mesh dim name of the tensor-parallel axis
    reshard_after_forward: bool = True  # fully_shard only: ZeRO-3 (True) or ZeRO-2 (False)
    strategy: str = ""
    local_maps: list[LocalMapCall] = field(default_factory=list)  # calls DTensor runs only through local_map
    module_outputs: list[ModuleOutput] = field(default_factory=list)  # outputs redistributed where they leave
    module_maps: list[ModuleLocalMap] = field(default_factory=list)  # modules run on shards (local_map)
    module_inputs: list[ModuleInput] = field(default_factory=list)  # inputs redistributed where they enter

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"DTensorExport.mode must be one of {MODES}, got {self.mode!r}")
        if len(self.mesh_dim_names) != len(self.mesh_shape):
            raise ValueError(f"mesh_dim_names {self.mesh_dim_names} must name each of {len(self.mesh_shape)} axes")

    def apply(self, module: Any, device_mesh: Any) -> Any:
        """Parallelise ``module`` in place on ``device_mesh`` (call on every rank); returns it."""
        from .dtensor_apply import apply

        return apply(self, module, device_mesh)

    def shard_batch(self, batch: dict[str, Any], device_mesh: Any) -> dict[str, Any]:
        """The full batch (same on every rank) as this rank should feed it: DTensors for ``distribute``,
        this rank's slice for ``fully_shard``, unchanged for ``parallelize_module``."""
        from .dtensor_apply import shard_batch

        return shard_batch(self, batch, device_mesh)

    def running(self) -> Any:
        """The context a forward (and its backward) runs in: plain tensors the model makes (masks,
        positions) act as replicated (``implicit_replication``), and the calls DTensor has no rule for
        run through ``local_map`` with sbplab's placements (``local_maps``). Enter it once per step."""
        import contextlib

        from torch.distributed.tensor.experimental import implicit_replication

        from .local_maps import local_map_mode

        stack = contextlib.ExitStack()
        stack.enter_context(implicit_replication())
        stack.enter_context(local_map_mode(self.local_maps))
        return stack

    def code(self) -> str:
        """The Python a user would write for this strategy with torch.distributed."""
        from .dtensor_code import code

        return code(self)

    def summary(self) -> str:
        lines = [f"{self.strategy}: DTensor mode {self.mode}, mesh {self.mesh_shape} {self.mesh_dim_names} "
                 f"({self.device_type})"]
        lines += [f"  {m}: {s}" for m, s in self.plan.items()]
        lines += [f"  local_map: {c.describe()}" for c in self.local_maps]
        lines += [f"  module output: {m.describe()}" for m in self.module_outputs]
        lines += [f"  module local_map: {m.describe()}" for m in self.module_maps]
        lines += [f"  module input: {m.describe()}" for m in self.module_inputs]
        lines += [f"  cannot express: {u}" for u in self.unsupported]
        return "\n".join(lines)


def to_dtensor(step: Any, model: Any = None, example_inputs: Any = None, loss_fn: Callable | None = None,
               target: Any = None) -> DTensorExport:
    """The DTensor equivalent of a compiled step (``sl.compile``), or of a strategy plus ``model``
    (traced on ``example_inputs`` or ``model.example_batch()``)."""
    from ..compiler.api import Compiled
    from ..compiler.deduction.strategy import Strategy

    if isinstance(step, Strategy):
        step = _compile(step, model, example_inputs, loss_fn, target)
    if not isinstance(step, Compiled):
        raise TypeError(f"to_dtensor takes a compiled step (sl.compile) or a Strategy with a model, "
                        f"got {type(step).__name__}")
    return _export(step)


def _compile(strategy: Any, model: Any, example_inputs: Any, loss_fn: Callable | None, target: Any) -> Any:
    from ..compiler.api import compile

    if model is None:
        raise TypeError("to_dtensor(strategy) needs model=, the torch module the strategy is for")
    if example_inputs is None:
        if not hasattr(model, "example_batch"):
            raise TypeError(f"to_dtensor: {type(model).__name__} has no example_batch(); pass example_inputs=")
        example_inputs, target = model.example_batch(2 * strategy.micro_batches)
    return compile(model, example_inputs, loss_fn=loss_fn or getattr(model, "loss_fn", None), target=target, strategy=strategy)


def _export(step: Any) -> DTensorExport:
    g, d, st = step.graph, step.deduction, step.strategy
    mesh = st.stages[0] if st.stages else st.placement
    ndim = mesh.ndim
    inputs = {n: d.sbp[n] for n in g.inputs}
    data_axes = {a for nd in inputs.values() for a, x in enumerate(nd) if isinstance(x, Split)}
    params = {p: d.sbp[p] for p in g.params}
    tp_axes = {a for nd in params.values() for a, x in enumerate(nd) if isinstance(x, Split) and a not in data_axes}
    zero_axes = {a for p, nd in params.items() for a, x in enumerate(nd) if isinstance(x, Split) and a in data_axes}
    zero = bool(zero_axes) or _grads_mostly_split(g, d, data_axes)
    names = _dim_names(mesh, data_axes, tp_axes)
    tp = min(tp_axes) if tp_axes else None
    plan = _plan(g, params, tp) if tp is not None else {}
    unsupported = _unsupported(step, mesh, plan, tp)
    if st.stages:
        mode = "pipeline"
    elif zero and ndim == 1:
        mode = "fully_shard"
    elif ndim == 1 and tp is not None and not data_axes and _covered(g, params, plan, tp):
        mode = "parallelize_module"
    else:
        mode = "distribute"
    if mode == "parallelize_module":
        unsupported += _local_reshapes(g, d, tp)
    if zero and tp is not None:
        unsupported.append("ZeRO together with tensor parallelism: DTensor writes it as parallelize_module on the "
                           "tp submesh, then fully_shard on the dp submesh (torchtitan's FSDP + TP); exported here "
                           "as plain placements, which keeps the sharded storage but not FSDP's prefetching")
    elif zero and ndim > 1:
        unsupported.append("ZeRO on an n-D mesh: use fully_shard(model, mesh=device_mesh) (HSDP) by hand")
    maps = module_local_maps(g, d) if mode == "distribute" else []
    calls = local_map_calls(step)
    prepared = module_inputs(g, d, [m.module for m in maps], tuple(TORCH_FUNCTIONS)) if mode == "distribute" else []
    return DTensorExport(
        mesh_shape=mesh.shape, mesh_dim_names=names,
        device_type=mesh.device_type or "cpu",  # a device-free strategy is written out for cpu, as before
        placements={p: placements_of(nd) for p, nd in params.items()},
        input_placements={n: placements_of(nd) for n, nd in inputs.items()},
        plan=plan, mode=mode, unsupported=unsupported, tp_dim=names[tp] if tp is not None else None,
        reshard_after_forward=bool(zero_axes), strategy=st.name, local_maps=calls,
        module_outputs=module_outputs(g, d) if mode == "distribute" else [], module_maps=maps,
        module_inputs=prepared)


def _grads_mostly_split(g: Any, d: Any, data_axes: set[int]) -> bool:
    """ZeRO-1/2: most of the parameters' elements have gradients reduce-scattered over a data axis. A few
    small ones split (sbplab reduce-scatters BatchNorm's when that is cheaper) do not make a step ZeRO, and
    FSDP would then keep BatchNorm statistics per rank where the step computes them over the whole batch."""
    total = split = 0
    for p in g.params:
        n = g.tensors[p].meta.numel
        total += n
        if p in g.grads and any(isinstance(x, Split) and a in data_axes for a, x in enumerate(d.sbp[g.grads[p]])):
            split += n
    return total > 0 and 2 * split > total


def _dim_names(mesh: Any, data_axes: set[int], tp_axes: set[int]) -> tuple[str, ...]:
    if mesh.axis_names:
        return tuple(mesh.axis_names)
    out: list[str] = []
    for a in range(mesh.ndim):
        name = "tp" if a in tp_axes else "dp" if a in data_axes else f"axis{a}"
        out.append(name if name not in out else f"{name}{a}")
    return tuple(out)


def _weight_users(g: Any) -> dict[str, tuple[str, str]]:
    """Weight tensor -> (module path, kind) of the forward op reading it: sbplab's ``linear``/``embedding``
    (input 1), or on a captured ATen graph ``aten.t``/``aten.permute`` of a 2-D weight (an nn.Linear,
    "linear"), ``aten.embedding`` (input 0), and a weight read straight by ``mm``/``addmm`` ("conv1d": a
    transformers Conv1D stores (in, out), which no ParallelStyle takes)."""
    out: dict[str, tuple[str, str]] = {}
    for op in g.ops_in("forward"):
        ins = [t for t in op.inputs if t in g.params and t.endswith(".weight")]
        if not ins:
            continue
        w = ins[0]
        module = w[: -len(".weight")]
        if len(op.inputs) > 1 and op.inputs[1] == w and op.type in ("linear", "embedding", "conv2d"):
            out.setdefault(w, (module, op.type))
        elif op.type == "aten.embedding.default" and op.inputs[0] == w:
            out.setdefault(w, (module, "embedding"))
        elif op.type in ("aten.t.default", "aten.permute.default") and len(g.tensors[w].meta.shape) == 2:
            out.setdefault(w, (module, "linear"))
        elif op.type in ("aten.mm.default", "aten.addmm.default"):
            out.setdefault(w, (module, "conv1d"))
        elif op.type.startswith("aten.convolution"):
            out.setdefault(w, (module, "conv2d"))
    return out


def _plan(g: Any, params: dict[str, tuple], tp: int) -> dict[str, str]:
    """ParallelStyles: a Linear split by output features is Colwise, by input features Rowwise; an
    Embedding split by vocabulary is Rowwise, by embedding dim Colwise (DTensor's own conventions)."""
    plan: dict[str, str] = {}
    for w, (module, kind) in _weight_users(g).items():
        x = params[w][tp]
        if not isinstance(x, Split):
            continue
        if kind == "linear":
            plan[module] = "ColwiseParallel()" if x.dim == 0 else "RowwiseParallel()"
        elif kind == "embedding":
            plan[module] = "RowwiseParallel()" if x.dim == 0 else "ColwiseParallel()"
    return plan


def _covered(g: Any, params: dict[str, tuple], plan: dict[str, str], tp: int) -> bool:
    """Every split parameter belongs to a planned module (so parallelize_module says it all). A captured
    ATen graph keeps the ``distribute`` road (its plan is listed, not applied): its forward, written for
    whole tensors, reads shapes that parallelize_module's local shards would change."""
    if any("." in op.type for op in g.ops_in("forward")):
        return False
    for p, nd in params.items():
        if isinstance(nd[tp], Split) and p.rsplit(".", 1)[0] not in plan:
            return False
    return True


def _unsupported(step: Any, mesh: Any, plan: dict[str, str], tp: int | None) -> list[str]:
    g, d, st = step.graph, step.deduction, step.strategy
    out: list[str] = []
    if st.stages:
        cuts = []
        fwd = g.ops_in("forward")
        for s in range(1, len(st.stages)):
            i = next((i for i, op in enumerate(fwd) if op.stage == s), None)
            if i is not None:
                cuts.append(f"{_outermost_starting_at(fwd, i)!r}: SplitPoint.BEGINNING")
        out.append(f"pipeline of {len(st.stages)} stages x {st.micro_batches} micro-batches: DTensor has no "
                   f"stages; use torch.distributed.pipelining.pipeline(model, mb_args, split_spec={{"
                   f"{', '.join(cuts)}}}) with ScheduleGPipe(n_microbatches={st.micro_batches})")
    elif st.micro_batches > 1:
        out.append(f"{st.micro_batches} micro-batches: DTensor has no micro-batching; accumulate gradients "
                   f"over {st.micro_batches} forward/backward passes before optimizer.step()")
    for h in st.signatures:
        out.append(f"{h.describe()} ({h.text!r}): DTensor chooses each op's sharding itself; there is no "
                   f"per-op signature to force (redistribute that op's inputs by hand)")
    for w, (module, kind) in _weight_users(g).items():
        if tp is not None and isinstance(d.sbp[w][tp], Split) and kind not in ("linear", "embedding"):
            out.append(f"{module} ({kind}) weight split {d.sbp[w]}: no ParallelStyle for {kind}; exported as "
                       f"a DTensor placement only")
    for name in list(g.params) + list(g.inputs):
        for a, x in enumerate(d.sbp[name]):
            n = g.tensors[name].shape[x.dim] if isinstance(x, Split) else 0
            if isinstance(x, Split) and n % mesh.shape[a]:
                out.append(f"{name}: {n} elements split over {mesh.shape[a]} ranks unevenly; DTensor's Shard "
                           f"chunks like torch.chunk, sbplab balances (local shapes may differ)")
    return out


def _local_reshapes(g: Any, d: Any, tp: int) -> list[str]:
    """Reshapes of tensor-parallel activations: under parallelize_module the forward sees local shards."""
    out = []
    for op in g.ops_in("forward"):
        if op.type == "reshape" and isinstance(d.sbp[op.inputs[0]][tp], Split):
            out.append(f"reshape {op.name!r} in {op.module or 'the model'} reads a tensor-parallel shard: with "
                       f"parallelize_module the forward sees local tensors, so its target shape {op.attrs.get('shape')} "
                       f"must use local sizes (heads // tp) or -1, as torchtitan's models do")
    return out


def _outermost_starting_at(fwd: list, i: int) -> str:
    """The widest module whose first forward op is ``fwd[i]`` (``blocks.1`` rather than ``blocks.1.fc1``):
    where torch.distributed.pipelining splits."""
    module = fwd[i].module
    if not module:
        return fwd[i].name
    before = {op.module for op in fwd[:i]}
    parts = module.split(".")
    for n in range(1, len(parts) + 1):
        prefix = ".".join(parts[:n])
        if not any(m == prefix or m.startswith(prefix + ".") for m in before):
            return prefix
    return module
