"""torch.fx tracing with concrete shapes.

Plain ``symbolic_trace`` cannot run ``B, T, C = x.size()`` followed by ``self.mask[:T, :T]``: the
sizes are proxies. Here every proxy also carries a *meta* tensor (shape and dtype, no data) computed
as the graph is recorded, so ``size()``, ``shape``, ``dim()`` and ``len()`` return plain ints, Python
control flow on shapes works, and work on buffers alone folds into constants. Leaf modules run with
their parameters swapped for meta tensors, so tracing a large
model allocates nothing.

Two things keep tracing a deep model fast: meta computations are memoised (``fx_memo``: identical
layers ask identical questions), and each node's user source line is found by walking the Python
frames directly, not through fx's recorded stack traces (which symbolize every frame of every node
and, the first time, import half of torch's compiler stack to learn which files to skip).
"""

from __future__ import annotations

import linecache
import re
import sys
import traceback
from typing import Any

import torch
import torch.fx as fx
from torch.nn.utils.stateless import _reparametrize_module

from . import fx_memo


def _to_meta(v: Any) -> Any:
    if isinstance(v, _ShapeProxy):
        if v._meta is None:
            raise RuntimeError(f"the shape of {v.node.name!r} is unknown")
        return v._meta
    if isinstance(v, fx.Proxy):
        raise RuntimeError(f"{v.node.name!r} has no shape")
    if isinstance(v, torch.Tensor):
        return v.to("meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_meta(x) for k, x in v.items()}
    if isinstance(v, torch.device):
        return torch.device("meta")
    return v


class _ShapeProxy(fx.Proxy):
    """An fx proxy that knows its meta value, so shape queries are concrete."""

    _meta: Any = None

    def size(self, dim: int | None = None):
        m = self._need()
        return m.size() if dim is None else m.size(dim)

    @property
    def shape(self):
        return self._need().shape

    def dim(self) -> int:
        return self._need().dim()

    @property
    def ndim(self) -> int:
        return self._need().dim()

    @property
    def dtype(self):
        return self._need().dtype

    @property
    def device(self) -> torch.device:
        """Constants made with ``device=x.device`` are made on the CPU while tracing."""
        return torch.device("cpu")

    def numel(self) -> int:
        return self._need().numel()

    def __len__(self) -> int:
        return len(self._need())

    def __iter__(self):
        m = self._need()
        n = len(m) if isinstance(m, (tuple, list)) else m.shape[0]
        return iter([self[i] for i in range(n)])

    def _need(self):
        if self._meta is None:
            raise RuntimeError(f"sbplab's tracer could not work out the shape of {self.node.name!r} "
                               f"({self.node.op} {self.node.target}); its shape is needed here")
        return self._meta


class ShapeTracer(fx.Tracer):
    """fx.Tracer whose proxies carry meta values; records user stack traces for error messages."""

    def __init__(self, example_inputs: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.record_stack_traces = False  # ``create_node`` records the user's source line itself
        self.example = {k: v.to("meta") for k, v in example_inputs.items()}
        self._memo: dict[tuple, Any] = {}  # meta call -> its answer (see fx_memo)
        self._lines: dict[tuple[str, int], str] = {}  # (file, line number) -> its source, stripped

    _plain_getattr = False  # while computing a leaf module's meta, its parameters are plain tensors

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if self._plain_getattr:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ShapeProxy(node, self)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> fx.Node:
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if not node.stack_trace:
            node.meta["sbplab_source"] = _user_source(sys._getframe(1), self._lines)
        return node

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        rv = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if isinstance(rv, _ShapeProxy):
            self._plain_getattr = True  # module attributes are plain tensors while computing metas
            try:
                with torch.no_grad():
                    rv._meta = self._meta_of(kind, target, args, kwargs, rv.node)
            except Exception:  # unknown shape: fine until someone asks for it
                rv._meta = None
            finally:
                self._plain_getattr = False
            rv.node.meta["sbplab_meta"] = rv._meta
        return rv

    def _meta_of(self, kind: str, target: Any, args: tuple, kwargs: dict, node: fx.Node) -> Any:
        if kind == "placeholder":
            return self.example[node.name] if node.name in self.example else self.example.get(target)
        if kind == "get_attr":
            return _to_meta(self._attr(target))
        a, k = _to_meta(args), _to_meta(kwargs)
        try:
            key = fx_memo.call_key(kind, target, a, k, self.root.get_submodule(target) if kind == "call_module" else None)
        except fx_memo.NoKey:
            return self._compute(kind, target, a, k)
        got = self._memo.get(key, fx_memo.NOT_MEMOISED)
        if got is fx_memo.NOT_MEMOISED:
            try:
                got = self._compute(kind, target, a, k)
            except Exception:
                if key not in self._memo:
                    self._memo[key] = fx_memo.FAILED
                raise
            if key not in self._memo:
                self._memo[key] = fx_memo.store(got, fx_memo.tensors_in((a, k)))
            return got
        if got is fx_memo.FAILED:
            raise RuntimeError(f"the shape of {node.name!r} is unknown")
        return fx_memo.fresh(got)

    def _compute(self, kind: str, target: Any, a: Any, k: Any) -> Any:
        if kind == "call_function":
            return target(*a, **k)
        if kind == "call_method":
            return getattr(a[0], target)(*a[1:], **k)
        if kind == "call_module":
            mod = self.root.get_submodule(target)
            state = {n: t.to("meta") for n, t in list(mod.named_parameters()) + list(mod.named_buffers())}
            with _reparametrize_module(mod, state):  # forward, not __call__: fx patches __call__
                return type(mod).forward(mod, *a, **k)
        return None

    def _attr(self, target: str) -> Any:
        obj = self.root
        for atom in target.split("."):
            obj = getattr(obj, atom)
        return obj


def trace(module: torch.nn.Module, example_inputs: dict[str, torch.Tensor]) -> fx.Graph:
    """Trace ``module.forward`` with the given named example inputs (only their shapes are used)."""
    tracer = ShapeTracer(example_inputs)
    graph = tracer.trace(module)
    graph._sbplab_root = tracer.root  # type: ignore[attr-defined]  (constants live on the root)
    return graph


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)\n\s*([^\n]*)')


def _skipped(path: str) -> bool:
    return "/torch/" in path or "/sbplab/compiler/" in path


def _user_source(frame: Any, lines_seen: dict[tuple[str, int], str]) -> str:
    """``source_of``'s answer for a node made now, from the live frames.

    fx would keep the frames from the outermost ``forward`` on, drop torch's own files, format them
    and ``source_of`` would take the innermost frame outside torch and this compiler. When every
    one of those frames has its source line, that is simply the innermost such frame; a frame
    without one changes how the formatted text parses, so then the text is built and parsed the
    way fx and ``source_of`` always did.
    """
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    first = next((i for i in range(len(frames) - 1, -1, -1) if frames[i].f_code.co_name == "forward"), None)
    if first is None:
        return ""
    kept = frames[:first + 1]  # innermost first
    lines = []
    for f in kept:
        where = (f.f_code.co_filename, f.f_lineno)
        line = lines_seen.get(where)
        if line is None:
            line = lines_seen[where] = linecache.getline(*where).strip()
        lines.append(line)
    if all(lines):
        for f, line in zip(kept, lines):
            path = f.f_code.co_filename
            if not _skipped(path) and path != "<string>":
                return f"{path.rsplit('/', 1)[-1]}:{f.f_lineno}  {line}"
        return ""
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    summary = traceback.StackSummary.from_list(
        [traceback.FrameSummary(f.f_code.co_filename, f.f_lineno, f.f_code.co_name) for f in reversed(kept)
         if f.f_code.co_filename not in uninteresting_files()])
    return _parse("".join(summary.format()).strip()) if summary else ""


def source_of(node: fx.Node) -> str:
    """``file.py:42  code`` of the user line that made ``node`` (library frames skipped)."""
    if "sbplab_source" in node.meta:
        return node.meta["sbplab_source"]
    return _parse(node.stack_trace or "")


def _parse(st: str) -> str:
    best = ""
    for path, line, _fn, code in _FRAME.findall(st):
        if "/torch/" in path or "/sbplab/compiler/" in path:
            continue
        best = f"{path.rsplit('/', 1)[-1]}:{line}  {code.strip()}"
    return best
