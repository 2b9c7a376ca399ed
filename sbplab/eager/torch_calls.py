"""``sl.apply`` by name: each name is the torch function a user would call, and its ATen ops are the ones
torch itself records for it, traced once per shapes and arguments.

Why trace rather than map names to ops by hand: the capture (``compiler/frontend/aten_capture.py``)
records what torch's dispatcher runs, after the same decompositions (``ops/aten/decompositions.py``); tracing the
same torch function the same way on meta tensors gives the same ATen ops (``F.linear`` of a 3-D input
is view, t, addmm, view; ``F.cross_entropy`` is the fused ``cross_entropy_rows``), so a lone op and
a compiled one are decided by the same family rule (``sbplab/ops/aten/rules.py``): one home per rule.
Nothing is computed at trace time (meta tensors); each ATen op then runs on the shards under the
signature dispatch chooses for it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from ..errors import InputError, OpError
from ..freeze import freeze
from ..ops.aten.calls import DeviceSlot, Slot, op_name, passed_through
from ..ops.registry import TensorMeta
from .aten_eager import AtenStep


@dataclass(frozen=True)
class TorchCall:
    """An eager op name: what its inputs and attrs are (said in errors), and the torch function of the
    inputs it stands for, built from the attrs."""

    inputs: str
    attrs: tuple[str, ...]
    make: Callable[[dict], Callable[..., torch.Tensor]]


def _ln(a: dict) -> Callable:
    ns = a["normalized_shape"]
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    return lambda x, w, b: F.layer_norm(x, ns, w, b, eps=float(a.get("eps", 1e-5)))


def _conv(a: dict) -> Callable:
    kw = {k: a[k] for k in ("stride", "padding", "dilation", "groups") if k in a}
    return lambda x, w, b=None: F.conv2d(x, w, b, **kw)


# sbplab's eager names beyond the global tensor's methods (``aten_eager.steps_of``), with the attrs
# they always took; each is the torch call below, so its rules are the ATen ops' rules
TORCH_CALLS: dict[str, TorchCall] = {
    "linear": TorchCall("x (..., in), weight (out, in)[, bias (out,)]", (), lambda a: F.linear),
    "layer_norm": TorchCall("x, weight, bias", ("normalized_shape", "eps"), _ln),
    "embedding": TorchCall("ids (int), weight (vocab, dim)", (), lambda a: F.embedding),
    "gather": TorchCall("x, index (int)", ("dim",), lambda a: lambda x, i: torch.gather(x, a["dim"], i)),
    "concat": TorchCall("tensors to join", ("dim",), lambda a: lambda *xs: torch.cat(xs, a.get("dim", 0))),
    "conv2d": TorchCall("x (N, C, H, W), weight (O, C/groups, kh, kw)[, bias (O,)]",
                        ("stride", "padding", "dilation", "groups"), _conv),
    "cross_entropy": TorchCall("logits (N, C), target (N,) int", (), lambda a: F.cross_entropy),
    "min": TorchCall("x", ("dim", "keepdim"),
                     lambda a: lambda x: torch.amin(x, a["dim"], bool(a.get("keepdim", False)))),
    "scale": TorchCall("x", ("factor",), lambda a: lambda x: x * a["factor"]),
    "add_scalar": TorchCall("x", ("value",), lambda a: lambda x: x + a["value"]),
}


@dataclass(frozen=True)
class Traced:
    """The ATen steps of one eager call, and which values (``Slot`` numbering: the inputs, then each
    step's outputs in order) are its results."""

    steps: tuple[AtenStep, ...]
    results: tuple[int, ...]


def traced_steps(name: str, metas: list[TensorMeta], attrs: dict) -> Traced:
    """The ATen ops torch runs for eager op ``name`` on tensors ``metas`` (cached); an OpError, worded
    with the op's inputs and attrs, where torch refuses the call."""
    call = TORCH_CALLS[name]
    unknown = sorted(set(attrs) - set(call.attrs))
    if unknown:
        raise InputError(f"{name}: unknown attrs {unknown}; {name} takes inputs {call.inputs}"
                         + (f" and attrs {', '.join(call.attrs)}" if call.attrs else " and no attrs"))
    return _trace(name, tuple(metas), freeze(attrs))


@lru_cache(maxsize=4096)
def _trace(name: str, metas: tuple[TensorMeta, ...], frozen: tuple) -> Traced:
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..ops.aten.cross_entropy_rows import PlainCrossEntropy, fused_cross_entropy
    from ..ops.aten.decompositions import decompositions

    call = TORCH_CALLS[name]
    attrs = dict(frozen)
    ins = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in metas]
    try:
        fn = call.make(attrs)
        with PlainCrossEntropy(fused_cross_entropy):  # the capture's form of F.cross_entropy (vocabulary whole)
            gm = make_fx(lambda *xs: fn(*xs), decomposition_table=decompositions())(*ins)  # F.* take defaults
    except KeyError as e:
        raise InputError(f"{name}: needs attr {e.args[0]!r} ({name} takes inputs {call.inputs} and attrs "
                         f"{', '.join(call.attrs)})") from None
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
        text = (str(e).strip().splitlines() or [""])[0]
        raise OpError(f"{name}: torch cannot run it on inputs of shapes {[m.shape for m in metas]} and dtypes "
                      f"{[m.dtype for m in metas]} ({name} takes {call.inputs}): {text}") from None
    return _to_steps(name, gm)


def _to_steps(name: str, gm: torch.fx.GraphModule) -> Traced:
    """The traced graph as ``AtenStep``s: each node's tensors as ``Slot``s of the values so far."""
    env: dict[torch.fx.Node, int | tuple[int, ...] | None] = {}
    steps: list[AtenStep] = []
    made: list[range] = []  # the value slots each step makes
    count = 0
    results: tuple[int, ...] = ()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = count
            count += 1
        elif node.op == "call_function" and node.target is operator.getitem:
            src, k = node.args
            env[node] = env[src][k]  # type: ignore[index]
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            op = op_name(node.target)
            if passed_through(op, node, env):
                continue
            args = _template(tuple(node.args), env)
            kwargs = tuple((k, _template(v, env)) for k, v in node.kwargs.items())
            steps.append(AtenStep(op, args, kwargs))
            val = node.meta.get("val")
            n = len(val) if isinstance(val, (tuple, list)) else 1
            env[node] = tuple(range(count, count + n)) if isinstance(val, (tuple, list)) else count
            made.append(range(count, count + n))
            count += n
        elif node.op == "output":
            out = node.args[0]
            outs = out if isinstance(out, (tuple, list)) else (out,)
            results = tuple(env[o] for o in outs)  # type: ignore[misc]
        else:
            raise OpError(f"{name}: its trace holds {node.op} {node.target!r}, which eager ops cannot run")
    if not steps:
        raise OpError(f"{name}: torch runs no op for these inputs (it returns an input as it is)")
    if any(r is None or isinstance(r, tuple) for r in results):
        raise OpError(f"{name}: its result is not a tensor torch computed (None or nested)")
    # a forced output SBP applies to the step making the first result
    main = next((k for k, r in enumerate(made) if results[0] in r), len(steps) - 1)
    steps = [AtenStep(s.op, s.args, s.kwargs, main=(k == main)) for k, s in enumerate(steps)]
    return Traced(tuple(steps), results)


def _template(v, env: dict):
    if isinstance(v, torch.fx.Node):
        return Slot(env[v])  # type: ignore[arg-type]
    if isinstance(v, (list, tuple)):
        return tuple(_template(x, env) for x in v)
    if isinstance(v, torch.device):
        return DeviceSlot()
    return v
