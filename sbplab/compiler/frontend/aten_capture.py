"""Capture a training step at ATen level with PyTorch's own machinery, as sbplab's logical graph.

``torch.export.export(strict=False)`` traces the user's module (decorators, keyword and defaulted
arguments, ``**kwargs``, model output objects, modules built inside forward all trace, since it runs
the real Python) under fake tensors; ``aot_export_joint_with_descriptors`` then gives the joint
forward + backward graph that torch's autograd derives (the route meta-pytorch/autoparallel takes),
functionalised (BatchNorm's running statistics become state updates) and described: which input is
which parameter, buffer or user input, which output is the loss or which parameter's gradient.
AOTAutograd runs straight on the module first (``aten_direct.py``: one trace instead of two, recording
the module paths and source lines export would), giving the graph export's route gives; a model that
route cannot trace goes through torch.export, which also words the error.

Each ATen node becomes one registry op named after its overload (``"aten.addmm.default"``) whose
attrs keep the rest of the call; SBP rules come from the op's family (``sbplab.ops.aten``). Nodes
keep the user's module path (forward nodes from ``nn_module_stack``, backward nodes from the
forward node they differentiate) and source line, so hints, pictures and errors speak in the
user's names. No activation is ever computed for real here: export runs on fake tensors and
sbplab infers shapes on meta tensors.

A few ops are decomposed first (torch's own decompositions) because their parts have exact SBP
rules while the whole does not: a mean over a split batch is a partial sum over a global count,
and a loss with ``ignore_index`` divides by a count that only the whole batch knows.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ...errors import SbplabError
from ...gc_pause import without_gc
from ...ops.aten.attention import AttentionMode
from ...ops.aten.calls import DeviceSlot, Slot, library_of, op_name, passed_through
from ...ops.aten.decompositions import decompositions
from ...ops.aten.rules import has_rule
from ..ir import Graph, GraphError
from .aten_direct import joint_direct
from .fx_trace import source_of
from .layer_copy import CopiedLayer, copy_layer
from .layer_pair import KEPT as PAIR
from .layer_pair import enabled as pair_enabled
from .layer_pair import repeat_pair
from .layer_repeat import KEPT, NODES, cut_to, find_layer_stack, repeat_layers
from .layer_repeat import enabled as repeat_enabled
from .vocab_cross_entropy import capture_mode


class CaptureError(GraphError):
    """The model could not be captured; the message names the module, source line and op."""


class ReplicatedOpWarning(UserWarning):
    """An op has no SBP rule: it runs whole (replicated) on every rank."""


class LocalOnlyOpWarning(UserWarning):
    """A custom op is defined in ``__main__``: worker processes cannot import it."""


class _Step(nn.Module):
    """The user's module and loss as one module whose output is the scalar loss."""

    def __init__(self, model: nn.Module, loss_fn: Callable | None, n_args: int, kw_names: tuple[str, ...]):
        super().__init__()
        self.m, self.loss_fn, self.n_args, self.kw_names = model, loss_fn, n_args, kw_names
        try:
            takes = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            takes = {}
        self.no_cache = "use_cache" in takes and "use_cache" not in kw_names  # transformers models

    def forward(self, *flat):
        args, kw = flat[: self.n_args], dict(zip(self.kw_names, flat[self.n_args: self.n_args + len(self.kw_names)]))
        if self.no_cache:  # a training step never reads a KV cache; building one would only cost memory
            kw["use_cache"] = False
        out = self.m(*args, **kw)
        if self.loss_fn is not None:
            return self.loss_fn(out, *flat[self.n_args + len(self.kw_names):])
        return _loss_of(out)


def _loss_of(out: Any) -> torch.Tensor:
    """The loss a model returns: a scalar tensor, ``out.loss`` (transformers), or ``out["loss"]``."""
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None and isinstance(out, (tuple, list)):  # (logits, loss), as nanoGPT returns
        scalars = [x for x in out if isinstance(x, torch.Tensor) and x.dim() == 0]
        loss = scalars[0] if len(scalars) == 1 else None
    if not isinstance(loss, torch.Tensor):
        raise CaptureError(f"the model returned {type(out).__name__} with no loss: pass loss_fn=..., or call it "
                           f"so it computes its own loss (a transformers model with labels=...)")
    return loss


DATA_DEPENDENT = ("data-dependent", "DataDependent", "Could not guard", "Could not extract specialized integer")


def _capture_failure(model: nn.Module, e: Exception) -> str:
    """torch.export's failure as: what failed, the user's line that caused it, what to do."""
    text = str(e).strip()
    where = ""
    for frame in traceback.extract_tb(e.__traceback__):
        if "/torch/" not in frame.filename and "/sbplab/" not in frame.filename:
            where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}  {(frame.line or '').strip()}"
    if any(k in text or k in type(e).__name__ for k in DATA_DEPENDENT):
        todo = ("Data-dependent Python control flow (an `if` on a tensor's value) cannot be captured; rewrite it "
                "with torch.where or torch.cond")
    else:
        todo = ("A model torch.export cannot trace cannot be captured at ATen level; capture='fx' maps sbplab's own "
                "op library instead")
    return (f"torch.export could not capture {type(model).__name__}: {type(e).__name__}: "
            f"{text.splitlines()[0] if text else ''}" + (f"\n  at {where}" if where else "") + f"\n  {todo}.")


def _input_names(model: nn.Module, n_args: int) -> list[str]:
    try:
        params = [p.name for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[k] if k < len(params) else f"input{k}" for k in range(n_args)]


def _module_of(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = path.split(".", 1)[1] if path.startswith("m.") else ("" if path == "m" else path)
    return path


@without_gc
def capture_aten(model: nn.Module, args: tuple, kwargs: dict[str, torch.Tensor], loss_fn: Callable | None = None,
                 targets: tuple[torch.Tensor, ...] = (), autocast: torch.dtype | None = None,
                 repeat: bool = True) -> tuple[Graph, dict[str, str]]:
    """The joint graph of ``loss_fn(model(*args, **kwargs), *targets)`` (or the model's own loss) as
    a ``Graph`` with forward and backward ops; returns it and param -> gradient (one micro-batch).

    The loss's gradient seed is a ``fill`` op of value 1 (``aten_training_graph`` scales it for
    micro-batches). ``autocast``: a dtype to capture under ``torch.autocast`` (mixed precision: its
    casts become ops of the graph, see ``training/precision_pass.py``). ``repeat``: capture a stack of
    identical layers once and copy it (``layer_repeat``; the graph is the same node for node); False
    (or ``layer_repeat.whole_capture()``) captures every layer."""
    flat = (*args, *kwargs.values(), *targets)
    names = [*_input_names(model, len(args)), *kwargs, *[f"target{k}" if k else "target" for k in range(len(targets))]]
    stack = find_layer_stack(model) if repeat and repeat_enabled() else None
    if stack is not None:  # identical layers: capture two (layer_pair.py), else three (layer_repeat.py)
        for keep, repeat in ((PAIR, repeat_pair), (KEPT, repeat_layers)):
            if keep == PAIR and not pair_enabled():
                continue
            with cut_to(model, stack, keep):
                gm = _joint(model, flat, loss_fn, len(args), tuple(kwargs), autocast)
            whole = repeat(gm, stack)
            if whole is not None:
                return _to_graph(whole, model, names, flat)
    gm = _joint(model, flat, loss_fn, len(args), tuple(kwargs), autocast)
    return _to_graph(gm, model, names, flat)


def import_capture_machinery() -> None:
    """Import what a capture runs (torch.export's tracer, AOTAutograd and its partitioner, TorchDynamo
    under them) ahead of the first capture, which otherwise pays it: about a CPU second, once per
    process, like importing torch. ``benchmarks/bench_compile.py`` calls it before its clock starts
    and prints its time apart."""
    import torch._functorch.aot_autograd  # noqa: F401
    import torch._functorch.partitioners  # noqa: F401
    import torch.export._trace  # noqa: F401


_THROUGH_EXPORT = [False]


@contextlib.contextmanager
def through_export() -> Iterator[None]:
    """Capture through ``torch.export`` first inside this block (the route ``aten_direct`` skips; tests
    compare the two)."""
    before = _THROUGH_EXPORT[0]
    _THROUGH_EXPORT[0] = True
    try:
        yield
    finally:
        _THROUGH_EXPORT[0] = before


def _joint(model: nn.Module, flat: tuple, loss_fn: Callable | None, n_args: int, kw_names: tuple[str, ...],
           autocast: torch.dtype | None) -> fx.GraphModule:
    """The joint forward + backward graph, with descriptors: AOTAutograd straight on the module
    (``aten_direct``), else torch.export then AOTAutograd. The direct route takes models on the meta
    device (traced as a fake copy, where it gives export's graph node for node); a model with real
    tensors, and anything the direct route cannot trace, go through export (which, given one tensor
    as two inputs or a tied weight, wires them its own way)."""
    if not _THROUGH_EXPORT[0] and _on_meta(model, flat):  # the fake copy: fresh inputs, each weight its own
        traced, traced_flat = _fake_copy(model, flat)
        try:
            with _capture_contexts(autocast) as stack:
                return joint_direct(_Step(traced, loss_fn, n_args, kw_names), traced_flat, decompositions(), stack)
        except SbplabError:
            raise
        except Exception:  # noqa: BLE001  (export captures it, or says why in the user's terms)
            pass
    return _joint_through_export(model, flat, loss_fn, n_args, kw_names, autocast)


@contextlib.contextmanager
def _capture_contexts(autocast: torch.dtype | None) -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as stack:
        if autocast is not None:
            stack.enter_context(torch.autocast("cpu", dtype=autocast))
        stack.enter_context(AttentionMode())  # SDPA as one op whose kernel the device picks
        stack.enter_context(capture_mode())  # a strategy splitting the vocabulary: the loss on its shards
        yield stack


def _joint_through_export(model: nn.Module, flat: tuple, loss_fn: Callable | None, n_args: int,
                          kw_names: tuple[str, ...], autocast: torch.dtype | None) -> fx.GraphModule:
    """torch.export then torch's autograd: the joint forward + backward graph, with descriptors."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    traced, traced_flat = _fake_copy(model, flat) if _on_meta(model, flat) else (model, _distinct(flat))
    step = _Step(traced, loss_fn, n_args, kw_names)
    try:
        with _capture_contexts(autocast) as stack:
            ep = torch.export.export(step, traced_flat, strict=False)
            joint = aot_export_joint_with_descriptors(stack, ep.module(), traced_flat, decompositions=decompositions())
    except SbplabError:
        raise
    except Exception as e:  # noqa: BLE001  (torch's own tracing errors, reworded with what to do)
        raise CaptureError(_capture_failure(model, e)) from e
    return joint.graph_module


def _distinct(flat: tuple) -> tuple:
    """The inputs with a tensor given twice (``input_ids`` as ``labels``) copied: traced as one tensor, every
    read of either would go to one graph input, and a later batch whose two differ would feed one to both."""
    out: list = []
    for x in flat:
        out.append(x.clone() if isinstance(x, torch.Tensor) and any(x is y for y in out) else x)
    return tuple(out)


def _on_meta(model: nn.Module, flat: tuple) -> bool:
    tensors = [*model.parameters(), *model.buffers(), *flat]
    return any(t.device.type == "meta" for t in tensors)


def _fake_copy(model: nn.Module, flat: tuple) -> tuple[nn.Module, tuple]:
    """A model on the meta device, as a copy whose parameters, buffers and inputs are fake CPU tensors.

    Some ops have meta kernels that bypass autograd (``nll_loss``: its gradient would be lost), so a
    meta model is traced as fake tensors instead; neither allocates a parameter or an activation,
    which is what lets a model of billions of parameters compile on a laptop.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = copy.deepcopy(model)
    with FakeTensorMode():
        for mod in fake.modules():
            for k, p in list(mod._parameters.items()):
                if p is not None:
                    mod._parameters[k] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad)
            for k, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[k] = torch.empty(b.shape, dtype=b.dtype)
        inputs = tuple(torch.zeros(x.shape, dtype=x.dtype) for x in flat)
    return fake, inputs


def _to_graph(gm: fx.GraphModule, model: nn.Module, input_names: list[str], flat: tuple) -> tuple[Graph, dict]:
    g = Graph()
    # tied weights (GPT-2's lm_head and wte) are one tensor with several names: one graph param
    canonical: dict[int, str] = {}
    by_name: dict[str, torch.Tensor] = {}
    for fqn, p in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        by_name[fqn] = p
        canonical.setdefault(id(p), fqn)
    env: dict[fx.Node, Any] = {}  # fx node -> graph tensor name, or a tuple of names for multi-output ops
    params_of: dict[str, str] = {}  # captured param name -> graph param
    seq_op: dict[int, str] = {}  # autograd seq_nr -> the forward op it belongs to
    replicated: dict[str, set[str]] = {}
    sources: dict[str, str] = {}  # stack trace -> the user's line (copied layers share their traces)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = _placeholder(g, node, canonical, by_name, input_names, flat, params_of)
        elif node.op == "get_attr":  # a constant tensor the model made (lifted by export)
            value = getattr(gm, node.target)
            env[node] = g.add_tensor(g.fresh_name(f"const.{node.target}"), tuple(value.shape), "const", value.dtype,
                                     value=value.detach().clone()).name
        elif node.op == "call_function":
            _call(g, node, env, seq_op, replicated, sources)
        elif node.op == CopiedLayer.op:  # a middle layer copied from a converted one (layer_copy.py)
            copy_layer(g, node, env, seq_op, replicated, lambda n: _call(g, n, env, seq_op, replicated, sources))
        elif node.op == "output":
            grads = _outputs(g, node, env, params_of)
    if replicated:
        warnings.warn("ops with no SBP rule run replicated (whole on every rank): " + "; ".join(
            f"{op} in {', '.join(sorted(m or '<top>' for m in mods)[:3])}" for op, mods in sorted(replicated.items()))
            + ". Add a rule with sl.register_rule(op, signatures).", ReplicatedOpWarning, stacklevel=3)
    g.validate()
    return g, grads


def _placeholder(g: Graph, node: fx.Node, canonical: dict, by_name: dict, input_names: list[str], flat: tuple,
                 params_of: dict[str, str]) -> str | None:
    desc = node.meta.get("desc")
    kind = type(desc).__name__
    val = node.meta.get("val")
    if kind in ("ParamAOTInput", "BufferAOTInput"):
        fqn = desc.target[2:] if desc.target.startswith("m.") else desc.target
        t = by_name.get(fqn)
        if t is None:
            raise CaptureError(f"captured {kind[:-8].lower()} {fqn!r} is not a parameter or buffer of the model")
        name = canonical[id(t)]
        params_of[fqn] = name
        if name not in g.tensors:
            role = "param" if kind == "ParamAOTInput" else "state"
            g.add_tensor(name, tuple(t.shape), role, t.dtype, value=t.detach().clone(), module=name.rpartition(".")[0])
        return name
    if kind == "PlainAOTInput":
        x = flat[desc.idx]
        name = input_names[desc.idx]
        if x.requires_grad:
            x = x.detach()
        g.add_tensor(name, tuple(x.shape), "input", x.dtype)
        return name
    if kind == "TangentAOTInput":
        return g.add_op("fill", [], {"shape": tuple(val.shape), "value": 1.0, "dtype": val.dtype},
                        phase="backward", name="loss.seed").outputs[0]
    raise CaptureError(f"unexpected captured input {node.name} ({desc!r})")


_SLOTS = tuple(Slot(k) for k in range(64))  # shared: equal templates then compare by identity (deduction's twins)


def _template(v: Any, env: dict, inputs: list[str]) -> Any:
    if isinstance(v, NODES):
        name = env[v]
        if name is None:
            return None
        inputs.append(name)
        k = len(inputs) - 1
        return _SLOTS[k] if k < len(_SLOTS) else Slot(k)
    if isinstance(v, (list, tuple)):
        return tuple(_template(x, env, inputs) for x in v)
    if isinstance(v, torch.device):
        return DeviceSlot()
    return v


def _source(node: fx.Node, sources: dict[str, str]) -> str:
    """``source_of(node)``, parsed once per distinct stack trace."""
    trace = node.meta.get("stack_trace")
    if "sbplab_source" in node.meta or not isinstance(trace, str):
        return source_of(node)
    found = sources.get(trace)
    if found is None:
        found = sources[trace] = source_of(node)
    return found


def _call(g: Graph, node: fx.Node, env: dict, seq_op: dict[int, str], replicated: dict[str, set[str]],
          sources: dict[str, str]) -> None:
    import operator

    if node.target is operator.getitem:
        src, k = node.args
        env[node] = env[src][k]
        return
    if not isinstance(node.target, torch._ops.OpOverload):
        raise CaptureError(f"captured node {node.name} calls {node.target!r}, which is not an ATen op"
                           f" (at {source_of(node) or 'an unknown line'})")
    name = op_name(node.target)
    if passed_through(name, node, env):
        return
    inputs: list[str] = []
    attrs = {"args": _template(tuple(node.args), env, inputs),
             "kwargs": tuple((k, _template(v, env, inputs)) for k, v in node.kwargs.items())}
    lib = library_of(name)
    if lib:  # workers import it to find the op
        attrs["lib"] = lib
        if lib == "__main__":
            warnings.warn(f"custom op {name} is defined in __main__ (a notebook or script): worker processes "
                          f"cannot import it, so the step runs only in this process (step.executor()); define "
                          f"it in a module to run it on a cluster", LocalOnlyOpWarning, stacklevel=4)
    backward = node.meta.get("partitioner_tag") == "is_backward"
    module = _module_of(node)
    seq = node.meta.get("seq_nr")
    base = f"{module}.{node.target._opname}" if module else node.target._opname
    source = _source(node, sources)
    try:
        op = g.add_op(name, inputs, attrs, name=base, phase="backward" if backward else "forward", module=module,
                      source=source, forward_op=seq_op.get(seq) if backward else None)
    except SbplabError as e:
        raise CaptureError(f"{name} in module {module or '<top>'} (at {source or 'an unknown line'}): {e}") from e
    if not backward and seq is not None:
        seq_op[seq] = op.name
    if not has_rule(name):
        replicated.setdefault(name, set()).add(module)
    val = node.meta.get("val")
    env[node] = tuple(op.outputs) if isinstance(val, (tuple, list)) else op.outputs[0]


def _outputs(g: Graph, node: fx.Node, env: dict, params_of: dict[str, str]) -> dict[str, str]:
    grads: dict[str, str] = {}
    for v, desc in zip(node.args[0], node.meta.get("desc", ())):
        kind = type(desc).__name__
        name = env.get(v) if isinstance(v, NODES) else None
        if kind == "PlainAOTOutput" and desc.idx == 0:
            g.loss = name
        elif kind == "GradAOTOutput" and name is not None:
            fqn = desc.grad_of.target
            param = params_of[fqn[2:] if fqn.startswith("m.") else fqn]
            if param in grads:  # a tied weight: its gradients from every use add up
                name = g.add_op("aten.add.Tensor", [grads[param], name],
                                {"args": (Slot(0), Slot(1)), "kwargs": ()}, phase="backward",
                                module=g.tensors[param].module).outputs[0]
            grads[param] = name
        elif kind == "InputMutationAOTOutput" and name is not None:
            target = getattr(desc.mutated_input, "target", "")  # a buffer (BatchNorm's running statistics)
            state = params_of.get(target[2:] if target.startswith("m.") else target)
            if state is None:
                raise CaptureError(f"the model mutates an input in place ({desc.mutated_input!r}); only buffer "
                                   f"updates are kept across steps")
            g.state_updates[state] = name
    if g.loss is None:
        raise CaptureError("the captured step has no loss output")
    return grads
