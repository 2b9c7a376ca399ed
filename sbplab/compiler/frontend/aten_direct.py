"""The joint graph straight from the module: AOTAutograd without the ``torch.export`` pass before it.

``torch.export`` traces the forward once, then ``aot_export_joint_with_descriptors`` traces the exported
program again with autograd: two traces of the same forward, and the first costs as much as a third of
a capture (0.4-0.9 CPU s of a 32-layer Llama's). Traced straight from the module, AOTAutograd gives the
same ATen nodes (the export pass only adds ``_assert_tensor_metadata`` checks, which the capture drops),
but not what export records on each node: the module it was called in and the user's source line, which
hints, pictures and errors speak in. So this route records them itself, as export does:

- the module path: global forward hooks keep the stack of modules being called, written into
  ``torch.fx.traceback``'s current node metadata (``nn_module_stack``, as export writes it);
- the source line: a torch-function mode writes, for each torch call, the stack export would keep (its
  ``forward`` frames; ``fx_trace.source_of`` reads the innermost user frame of it);
- ``torch.compiler.is_exporting()`` is true inside, as under export (transformers' masks check it).

Anything this route does not capture raises, and the caller captures through export instead
(``aten_capture._joint``), which also words the error.
"""

from __future__ import annotations

import contextlib
import linecache
import sys
from collections.abc import Iterator
from typing import Any

import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.nn as nn
from torch.overrides import TorchFunctionMode


class _ModuleStack:
    """The modules being called, as export's ``nn_module_stack``: path -> (path, class)."""

    def __init__(self, root: nn.Module) -> None:
        self.paths = {id(m): p for p, m in root.named_modules(remove_duplicate=False)}
        self.stack: list[tuple[str, str]] = []

    def _publish(self) -> None:
        fx_traceback.current_meta["nn_module_stack"] = {p: (p, t) for p, t in self.stack}

    def pre(self, module: nn.Module, args: Any) -> None:
        path = self.paths.get(id(module))
        if path is not None:
            self.stack.append((path, f"{type(module).__module__}.{type(module).__qualname__}"))
            self._publish()

    def post(self, module: nn.Module, args: Any, out: Any) -> None:
        path = self.paths.get(id(module))
        if path is not None and self.stack and self.stack[-1][0] == path:
            self.stack.pop()
            self._publish()


def _kept(f: Any, stop: Any = None) -> tuple[list[tuple[str, int, str]], Any]:
    """The frames export keeps from ``f`` outwards (``forward`` functions, torch/__init__.py, fx's anchors),
    innermost first, up to and without the first frame running code ``stop`` (returned; None: none)."""
    kept = []
    while f is not None:
        code = f.f_code
        if code is stop:
            return kept, f
        name, path = code.co_name, code.co_filename
        if name == "forward" or path.endswith("torch/__init__.py") or (path, name) in fx.proxy._STACK_TRACE_ANCHORS:
            kept.append((path, f.f_lineno, name))
        f = f.f_back
    return kept, None


class _SourceLines(TorchFunctionMode):
    """Before each torch call, the stack trace export would record for the nodes it makes: the frames of
    ``forward`` functions (and torch/__init__.py), outermost first, in ``traceback``'s format.

    Every call is made inside the root module's ``forward`` (code ``root``); the frames that called it
    (the tracer's, tens deep) are suspended while it runs, so their part of the stack is read once per
    root call, and only the frames from the root's inwards are read per torch call."""

    def __init__(self, root: Any = None) -> None:
        super().__init__()
        self._text: dict[tuple, str] = {}
        self._root = root
        self._outer: tuple[Any, list] = (None, [])  # (the root call's frame, what its callers keep)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kept, at = _kept(sys._getframe(1), self._root)
        if at is not None:  # the root's own line moves (the model, then its loss): read each time
            kept.append((at.f_code.co_filename, at.f_lineno, at.f_code.co_name))
            if self._outer[0] is not at:  # a new root call: its callers, suspended while it runs, read once
                self._outer = (at, _kept(at.f_back)[0])
            kept += self._outer[1]
        key = tuple(kept)
        text = self._text.get(key)
        if text is None:
            lines = []
            for path, line, name in reversed(kept):
                code = linecache.getline(path, line).strip()
                lines.append(f'  File "{path}", line {line}, in {name}\n' + (f"    {code}\n" if code else ""))
            text = self._text[key] = "".join(lines).strip()
        fx_traceback.current_meta["stack_trace"] = text
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recorded_like_export(root: nn.Module) -> Iterator[None]:
    """Inside: nodes traced from ``root`` carry the module path and source line export records."""
    from torch._export.utils import _compiling_state_context

    stack = _ModuleStack(root)
    hooks = nn.modules.module
    with contextlib.ExitStack() as es:
        es.enter_context(fx_traceback.preserve_node_meta())
        es.enter_context(_compiling_state_context())
        pre = hooks.register_module_forward_pre_hook(stack.pre)
        es.callback(pre.remove)
        post = hooks.register_module_forward_hook(stack.post, always_call=True)
        es.callback(post.remove)
        lines = _SourceLines(getattr(type(root).forward, "__code__", None))
        es.enter_context(lines)
        es.callback(setattr, lines, "_outer", (None, []))  # no frame kept alive after the trace
        yield


def _code_on_demand() -> contextlib.AbstractContextManager[None]:
    """GraphModules made inside write their Python code only when it is read or run (torch.fx's
    ``_LazyGraphModule``, what Inductor uses for graphs it never runs). The capture reads the joint graph's
    nodes and never runs it, so the code generation AOTAutograd does twice per capture (a few hundredths
    of a second for two layers of Llama) is skipped; anything that does run the module gets its code then."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # a torch without it: the code is written as before
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


def joint_direct(step: nn.Module, flat: tuple, decompositions: dict, stack: contextlib.ExitStack) -> fx.GraphModule:
    """The joint forward + backward graph of ``step`` (a module returning the loss) on ``flat``, traced once."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    with recorded_like_export(step), _code_on_demand():
        joint = aot_export_joint_with_descriptors(stack, step, flat, decompositions=decompositions)
    return joint.graph_module

