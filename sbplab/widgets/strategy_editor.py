"""StrategyEditor: a preset on a mesh, signatures chosen per op, stages per module; live results.

A signature chosen for an op becomes a signature hint of the strategy (``Strategy.signature``), so
the compiler's own deduction obeys it and explains it.

After every change the editor deduces SBPs, lowers to the physical graph and counts memory, then
shows the physical (or deduced logical) graph, the memory per device and the communication, all
from the one ``Compiled`` it keeps as ``editor.compiled`` (what ``sl.compile`` would give for the
same strategy). Tracing and autodiff run only when the model, micro-batches or optimizer change;
an SBP change costs one deduction and one lowering. The graph picture (graphviz)
is drawn after the summary, tables and op list have been sent to the page, and the
simulator's prediction (step time, peak memory per rank on ``hardware``) comes last, in a message of
its own: lowering to the actor plan grows with the square of the plan, so a step of more than
``predict_limit`` op instances is predicted only on request (the predict button, ``predict()``). Bad
choices become the ``error`` trait; the page then keeps showing the last valid result (``stale``)
beside the error, so a typo does not wipe what the person was looking at, while ``compiled`` is
``None``: nothing matches the settings as they are.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import traitlets as t

from ..compiler.api import Compiled
from ..compiler.deduction.strategy import TensorParallelWarning
from ..compiler.ir import Graph
from ..compiler.physical.expand import lower
from ..compiler.physical.memory import memory_report
from ..fmt import fmt_bytes
from ..hardware import Hardware
from ..viz.charts import comm_rows, comm_table
from . import static_view as static
from . import strategy_form as form
from ._assets import widget_module, widget_style
from .editor_prediction import EditorPrediction
from .editor_views import candidate_rows, graph_dot, memory_rows, module_stages, op_rows, training_graph
from .messages import error_text, graph_view
from .model_builder import ModelBuilder
from .parse import parse_dims
from .svg_charts import comm_svg, memory_svg
from .zoo import BuiltModel

MAX_RANKS = 64
MAX_COMM_ROWS = 400
STRUCTURE = ("preset", "mesh_text", "micro_batches", "stages", "inner", "optimizer", "lr", "momentum", "choices",
             "hints", "stage_of")


class StrategyEditor(EditorPrediction):
    """``StrategyEditor(ModelBuilder("gpt"), preset="dp_tp", mesh=(2, 2))``; the result is ``.compiled``."""

    _esm = widget_module("strategy_editor.js")
    _css = widget_style("strategy_editor.css")

    # --- inputs ---------------------------------------------------------------------------------
    preset = t.Unicode("dp").tag(sync=True)  # one of strategy_form.PRESETS
    mesh_text = t.Unicode("2").tag(sync=True)  # the mesh ("2, 2"); for a pipeline, the mesh of each stage
    micro_batches = t.Int(1).tag(sync=True)
    stages = t.Int(2).tag(sync=True)  # pipeline stages
    inner = t.Unicode("none").tag(sync=True)  # pipeline: what runs inside a stage
    optimizer = t.Unicode("sgd").tag(sync=True)
    lr = t.Float(0.1).tag(sync=True)
    momentum = t.Float(0.0).tag(sync=True)  # sgd only
    choices = t.Dict().tag(sync=True)  # op name -> signature text ("(S(0)), (B) -> (S(0))")
    hints = t.List(t.Dict()).tag(sync=True)  # extra tensor hints {"pattern", "sbp", "role", "use"}
    stage_of = t.Dict().tag(sync=True)  # pipeline: module prefix -> stage
    selected_op = t.Unicode("").tag(sync=True)
    op_phase = t.Unicode("forward").tag(sync=True)  # which ops the table lists: a phase or "all"
    op_filter = t.Unicode("").tag(sync=True)  # substring of op name, type or module
    graph_kind = t.Unicode("physical").tag(sync=True)  # "physical" or "logical" (deduced, boxing nodes)
    graph_phases = t.List(t.Unicode(), default_value=["forward"]).tag(sync=True)
    graph_ranks = t.Unicode("all").tag(sync=True)  # "all" or "0, 1"
    collapse = t.Bool(True).tag(sync=True)

    # --- derived ----------------------------------------------------------------------------------
    preset_names = t.Dict(form.PRESETS).tag(sync=True)
    inner_names = t.List(t.Unicode(), default_value=list(form.INNER)).tag(sync=True)
    optimizer_names = t.List(t.Unicode(), default_value=list(form.OPTIMIZERS)).tag(sync=True)
    hint_roles = t.List(t.Unicode(), default_value=list(form.HINT_ROLES)).tag(sync=True)
    mesh_shape = t.List(t.Int()).tag(sync=True)
    ranks = t.List(t.Int()).tag(sync=True)
    strategy_name = t.Unicode("").tag(sync=True)
    modules = t.List(t.Dict()).tag(sync=True)  # {"name", "stage"}: the stage each module got
    ops = t.List(t.Dict()).tag(sync=True)  # name, type, module, phase, stage, signature, cost, hand, boxed
    ops_note = t.Unicode("").tag(sync=True)
    candidates = t.List(t.Dict()).tag(sync=True)  # the selected op's signatures: text, cost, chosen, best
    explain = t.Unicode("").tag(sync=True)  # why the selected op has its signature
    graph_svg = t.Unicode("").tag(sync=True)
    graph_text = t.Unicode("").tag(sync=True)
    graph_note = t.Unicode("").tag(sync=True)
    memory_rows = t.List(t.Dict()).tag(sync=True)
    memory_svg = t.Unicode("").tag(sync=True)
    memory_text = t.Unicode("").tag(sync=True)
    comm_rows = t.List(t.Dict()).tag(sync=True)
    comm_svg = t.Unicode("").tag(sync=True)
    comm_text = t.Unicode("").tag(sync=True)
    comm_bytes = t.Dict().tag(sync=True)  # rank (as text) -> bytes sent per step
    summary = t.Unicode("").tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    note = t.Unicode("").tag(sync=True)
    # beside the preset: its tensor parallelism "split nothing" or "left layers whole" in this model
    preset_badge = t.Unicode("").tag(sync=True)
    timings_ms = t.Dict().tag(sync=True)  # where the last recompute spent its time
    version = t.Int(0).tag(sync=True)  # +1 after every successful recompute
    stale = t.Bool(False).tag(sync=True)  # the views show the last valid result: the settings have an error

    def __init__(self, model: ModelBuilder | BuiltModel | torch.nn.Module, inputs: Any = None, *,
                 target: torch.Tensor | None = None, loss_fn: Callable | None = None, preset: str = "dp",
                 mesh: Any = (2,), micro_batches: int = 1, stages: int = 2, inner: str = "none",
                 optimizer: str = "sgd", lr: float = 0.1, momentum: float = 0.0, hardware: Hardware | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.builder: ModelBuilder | None = None
        self.model: BuiltModel | None = None
        self.compiled: Compiled | None = None
        self._set_hardware(hardware)
        self.dot = ""  # DOT text of the graph shown
        self._text_of: Callable[[], str] = str  # the graph shown as text, for when it is not drawn
        self._picture_due = False  # the DOT text changed and its picture is not drawn yet
        self._train: dict[tuple, Graph] = {}  # (micro-batches, optimizer) -> training graph of self.model
        self._busy = True
        if isinstance(model, ModelBuilder):
            self.builder = model
            model.observe(self._on_model, names="version")
            self.model = model.model
        elif isinstance(model, BuiltModel):
            self.model = model
        elif isinstance(model, torch.nn.Module):
            self.model = BuiltModel.from_module(model, inputs, target, loss_fn, 'StrategyEditor')
        else:
            raise TypeError(f"StrategyEditor needs a ModelBuilder, a BuiltModel or a torch module, "
                            f"got {type(model).__name__}")
        with self.hold_trait_notifications():
            self.preset, self.mesh_text = preset, _text(mesh)
            self.micro_batches, self.stages, self.inner = micro_batches, stages, inner
            self.optimizer, self.lr, self.momentum = optimizer, lr, momentum
        self._busy = False
        self._recompute()

    # --- what clicks do ---------------------------------------------------------------------------------
    def configure(self, **inputs: Any) -> None:
        """Set several inputs (``preset="dp_tp", mesh_text="2, 2"``) and recompute once."""
        bad = sorted(set(inputs) - set(STRUCTURE))
        if bad:
            raise TypeError(f"configure() takes {', '.join(STRUCTURE)}; not {', '.join(bad)}")
        self._busy = True
        try:
            for k, v in inputs.items():
                setattr(self, k, v)
        finally:
            self._busy = False
        self._recompute(next(iter(inputs), ""))

    def choose(self, op: str, signature: str) -> None:
        """Make ``op`` take ``signature`` (its text as listed in ``candidates``)."""
        self.choices = {**self.choices, op: signature}

    def clear_choice(self, op: str) -> None:
        self.choices = {k: v for k, v in self.choices.items() if k != op}

    def add_hint(self, pattern: str, sbp: str, role: str | None = None, use: bool = False) -> None:
        """A tensor hint on top of the preset's: tensors matching ``pattern`` must be ``sbp``."""
        self.hints = [*self.hints, {"pattern": pattern, "sbp": sbp, "role": role or "", "use": use}]

    def remove_hint(self, index: int) -> None:
        self.hints = [h for i, h in enumerate(self.hints) if i != index]

    def set_stage(self, module: str, stage: int) -> None:
        """Pipeline: put ``module`` (and what follows it, until the next given module) on ``stage``."""
        self.stage_of = {**self.stage_of, module: int(stage)}

    def optimizer_def(self):
        """The optimizer (``sl.SGD`` / ``sl.Adam``) the training graph was built with."""
        return form.make_optimizer(self.optimizer, self.lr, self.momentum)

    # --- observers ----------------------------------------------------------------------------------------
    def _on_model(self, change: dict) -> None:
        if self.builder is not None and self.builder.model is not None:
            self.model = self.builder.model
            self._train.clear()
            self._recompute("model")

    @t.observe(*STRUCTURE)
    def _on_structure(self, change: dict) -> None:
        if not self._busy:
            self._recompute(change["name"])

    @t.observe("selected_op")
    def _on_select(self, change: dict) -> None:
        if not self._busy:
            self._guard(self._detail)

    @t.observe("op_phase", "op_filter")
    def _on_table(self, change: dict) -> None:
        if not self._busy:
            self._guard(self._op_rows)

    @t.observe("graph_kind", "graph_phases", "graph_ranks", "collapse")
    def _on_graph(self, change: dict) -> None:
        if not self._busy:
            self._guard(self._draw_graph)

    def _guard(self, fn: Callable[[], None], keep_error: bool = False) -> None:
        """Run ``fn`` with notifications batched (sent together when it ends); an exception becomes the
        error message (added to the one shown with ``keep_error``)."""
        self._busy = True
        try:
            with self.hold_sync(), self.hold_trait_notifications():
                before = self.error if keep_error else ""
                try:
                    self.error = before
                    fn()
                except Exception as e:  # shown inline, never raised out of an observer
                    self.error = "; ".join(x for x in (before, error_text(e)) if x)
        finally:
            self._busy = False

    # --- the full recompute ---------------------------------------------------------------------------------
    def _recompute(self, cause: str = "") -> None:
        self._guard(lambda: self._derive(cause))
        if self._picture_due:  # a second message: the page shows the numbers while graphviz draws
            self._guard(lambda: self._picture(timed=True), keep_error=True)
        if self._auto_predicts():  # a third message: lowering to actors is the slowest part
            self._guard(lambda: self._predict(timed=True), keep_error=True)

    def _derive(self, cause: str) -> None:
        self.note = ""
        self.compiled, self._text_of = None, str  # the old step is freed before the new one is built
        self.prediction = None
        self._picture_due = False
        ms: dict[str, float] = {}
        notes: list[str] = []
        t0 = time.perf_counter()
        try:
            st, train = self._strategy_and_graph(ms)
            t1 = time.perf_counter()
            g, d = self._deduce(train, st, cause, notes)
            t2 = time.perf_counter()
            phys = lower(d)
            t3 = time.perf_counter()
            mem = memory_report(d, phys)
            t4 = time.perf_counter()
        except Exception:
            self.compiled = None
            self.stale = bool(self.strategy_name)  # the views keep the last valid result
            raise
        self.compiled = Compiled(g, st, d, phys, mem)
        self.stale = False
        ms.update(deduce=(t2 - t1) * 1e3, lower=(t3 - t2) * 1e3, memory=(t4 - t3) * 1e3)
        self.note = "; ".join(notes)
        self.strategy_name = st.name
        self.ranks = list(phys.ranks)
        if self.selected_op and self.selected_op not in g.op_by_name:
            self.selected_op = ""  # the op went away with the old model
        self._tables()
        t5 = time.perf_counter()
        problems = self._views(self._graph_source)
        t6 = time.perf_counter()
        problems += self._views(self._op_rows, self._detail)
        t7 = time.perf_counter()
        # "shown": until everything but the graph picture is on the page; "total" adds the picture
        ms.update(tables=(t5 - t4) * 1e3, graph=(t6 - t5) * 1e3, ops=(t7 - t6) * 1e3, shown=(t7 - t0) * 1e3,
                  total=(t7 - t0) * 1e3)
        self.timings_ms = {k: round(v, 2) for k, v in ms.items()}
        self.version += 1  # the step compiled: a view setting that does not fit it is only a message
        self._after_recompute()
        self.error = "; ".join(problems)

    @staticmethod
    def _views(*fns: Callable[[], None]) -> list[str]:
        out = []
        for fn in fns:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a view's bad setting must not undo the compile
                out.append(error_text(e))
        return out

    def _deduce(self, train: Graph, st: Any, cause: str, notes: list[str]):
        """Deduce with the chosen signatures; choices that stopped fitting are dropped, with a note."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g, d, kept, dropped = form.deduce_with_choices(train, st, self.choices, strict=cause == "choices")
        said = [w.message for w in caught if isinstance(w.message, TensorParallelWarning)]
        for w in caught:  # the others go on as they came
            if not isinstance(w.message, TensorParallelWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.preset_badge = ("" if not said else "splits nothing" if any(m.split_nothing for m in said)
                             else "layers left whole")
        notes += [str(m) for m in said]
        if kept != self.choices:
            self.set_trait("choices", kept)
        notes += dropped
        return g, d

    def _strategy_and_graph(self, ms: dict[str, float]):
        if self.model is None:
            raise ValueError(f"no model yet: {self.builder.error if self.builder else 'give one'}")
        t0 = time.perf_counter()
        mesh = parse_dims(self.mesh_text, "mesh shape", 3, max_total=MAX_RANKS)
        self.mesh_shape = list(mesh)
        st = form.make_strategy(self.preset, mesh, self.micro_batches, self.stages, self.inner, self.stage_of)
        if st.n_stages * (st.stages[0].size if st.stages else st.placement.size) > MAX_RANKS:
            raise ValueError(f"{st.name} needs more than {MAX_RANKS} ranks; use fewer stages or a smaller mesh")
        if self.stage_of and self.preset != "pipeline":
            self.stage_of = {}  # stages mean nothing without a pipeline
        form.add_hints(st, self.hints)
        opt = self.optimizer_def()
        t1 = time.perf_counter()
        key = (self.micro_batches, opt)
        if key not in self._train:
            self._train.clear()
            self._train[key] = training_graph(self.model, self.micro_batches, opt)
        ms.update(strategy=(t1 - t0) * 1e3, trace=(time.perf_counter() - t1) * 1e3)
        unknown = sorted(set(self.stage_of) - set(form.module_units(self._train[key])))
        if unknown:
            raise ValueError(f"a stage is given for {', '.join(map(repr, unknown))}, which the model does not have; "
                             f"its modules: {', '.join(form.module_units(self._train[key]))}")
        return st, self._train[key]

    def static_html(self) -> str:
        """The strategy, its error if any, memory and communication per rank, the summary."""
        sent = {int(r): b for r, b in self.comm_bytes.items()}
        rows = [(m["rank"], fmt_bytes(m["params"]), fmt_bytes(m["optimizer_state"]), fmt_bytes(m["activations_peak"]),
                 fmt_bytes(m["peak"]), fmt_bytes(sent.get(m["rank"], 0))) for m in self.memory_rows]
        return static.card(f"StrategyEditor: {self.strategy_name or 'no strategy'}", [
            static.line(self.error), static.table(("rank", "params", "optimizer state", "activation peak",
                                                   "peak memory", "bytes sent per step"), rows),
            static.pre(self.summary)])

    # --- views of the compiled step --------------------------------------------------------------------------
    def _tables(self) -> None:
        c = self.compiled
        phys = c.physical
        self.memory_rows = memory_rows(c)
        self.memory_svg, self.memory_text = memory_svg(c.memory), c.memory.table()
        self.comm_rows = [{**r, "group": list(r["group"])} for r in comm_rows(phys)[:MAX_COMM_ROWS]]
        self.comm_svg, self.comm_text = comm_svg(phys), comm_table(phys)
        self.comm_bytes = {str(r): b for r, b in phys.comm_bytes_per_rank().items()}
        self.summary = c.summary()
        self.modules = module_stages(c)

    def _draw_graph(self) -> None:
        self._graph_source()
        if self._picture_due:
            self._picture()

    def _graph_source(self) -> None:
        """The DOT text of the graph asked for (quick); ``_picture`` draws it."""
        self._picture_due = False
        if self.compiled is None:
            return
        self.dot, self._text_of = graph_dot(self.compiled, self.graph_kind, self.graph_phases, self.graph_ranks,
                                            self.collapse)
        self._picture_due = True

    def _picture(self, timed: bool = False) -> None:
        """The SVG of ``self.dot`` (or its text form where graphviz cannot draw it); ``timed``: the last
        step of a recompute, whose timings it completes."""
        self._picture_due = False
        t0 = time.perf_counter()
        self.graph_svg, self.graph_note = graph_view(self.dot)
        self.graph_text = self._text_of() if not self.graph_svg else ""
        ms = dict(self.timings_ms)
        if timed and "shown" in ms:
            svg = (time.perf_counter() - t0) * 1e3
            ms.update(svg=round(svg, 2), total=round(ms["shown"] + svg, 2))
            self.timings_ms = ms

    def _op_rows(self) -> None:
        if self.compiled is not None:
            self.ops, self.ops_note = op_rows(self.compiled, self.op_phase, self.op_filter, self.choices)

    def _detail(self) -> None:
        self.candidates, self.explain = [], ""
        if self.compiled is None or not self.selected_op:
            return
        self.candidates = candidate_rows(self.compiled, self.selected_op, self.choices)
        self.explain = self.compiled.explain(self.selected_op)


def _text(mesh: Any) -> str:
    if isinstance(mesh, str):
        return mesh
    if isinstance(mesh, int):
        return str(mesh)
    return ", ".join(str(int(n)) for n in mesh)
