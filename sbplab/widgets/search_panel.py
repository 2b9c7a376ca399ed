"""SearchPanel: ``sl.search`` behind a button; the searched strategy against every preset, and why.

Inputs are the search's own: a Hardware preset, a device count, a memory limit per device (blank:
none), the method and a time budget (blank: none). The Search button runs ``sl.search`` in the
kernel; its ``on_progress`` callback moves the bar and the best cost found so far while it runs.
The result is the table ``SearchResult.table()`` prints (predicted step time and memory of the
searched strategy and of each preset), ``SearchResult.explain()`` and the winner's prediction.

"Open in editor" shows the searched strategy in a ``StrategyEditor`` (the one the panel was given,
else a new one on the same model): its deduction takes exactly the searched signatures, and the
editor's views (graph, memory, communication, prediction, runs) work on it as on any strategy.

A request that cannot be served (a memory limit no strategy meets, more devices than the machine
has, text that is not a size) becomes the ``error`` trait; the last good result stays beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import traitlets as t

from ..fmt import fmt_bytes
from ..search import SearchProgress, SearchResult, search
from . import search_form as form
from . import static_view as static
from . import strategy_form
from ._assets import widget_module, widget_style
from .messages import error_text
from .model_builder import ModelBuilder
from .strategy_editor import StrategyEditor
from .widget_base import SbplabWidget
from .zoo import BuiltModel

INPUTS = ("hardware", "devices", "memory_limit", "method", "time_budget", "seed")
PROGRESS_EVERY_S = 0.1  # at most this often the bar is sent to the page while a search runs (and at the end)


class SearchPanel(SbplabWidget):
    """``SearchPanel(editor)`` or ``SearchPanel(ModelBuilder("gpt"))``; ``.search()`` fills ``.result``,
    ``.open_in_editor()`` shows it in a StrategyEditor."""

    _esm = widget_module("search_panel.js")
    _css = widget_style("search_panel.css")

    # --- inputs ---------------------------------------------------------------------------------------
    hardware = t.Unicode("h100_node").tag(sync=True)  # a key of search_form.HARDWARE
    devices = t.Int(8).tag(sync=True)
    memory_limit = t.Unicode("").tag(sync=True)  # bytes per device as text ("80 GB", "512 MiB"); "": no limit
    method = t.Unicode("auto").tag(sync=True)  # a key of search_form.METHODS
    time_budget = t.Unicode("").tag(sync=True)  # seconds as text ("5", "500 ms"); "": search everything
    seed = t.Int(0).tag(sync=True)  # for mcmc
    search_requests = t.Int(0).tag(sync=True)  # the page's Search button adds one
    open_requests = t.Int(0).tag(sync=True)  # the page's "open in editor" button adds one

    # --- derived ----------------------------------------------------------------------------------------
    hardware_names = t.Dict({k: h.label for k, h in form.HARDWARE.items()}).tag(sync=True)
    method_names = t.Dict(form.METHODS).tag(sync=True)
    model_name = t.Unicode("").tag(sync=True)
    status = t.Unicode("idle").tag(sync=True)  # idle, searching, done, failed
    phase = t.Unicode("").tag(sync=True)  # while searching: presets, meshes, pipelines, simulating
    progress = t.Float(0.0).tag(sync=True)  # 0..1
    units_done = t.Int(0).tag(sync=True)
    units_total = t.Int(0).tag(sync=True)
    best_ms = t.Float(None, allow_none=True).tag(sync=True)  # best searched step time so far (analytic)
    best_label = t.Unicode("").tag(sync=True)
    rows = t.List(t.Dict()).tag(sync=True)  # search_form.result_rows of the last good result
    table_text = t.Unicode("").tag(sync=True)  # SearchResult.table()
    explanation = t.Unicode("").tag(sync=True)  # SearchResult.explain()
    summary = t.Unicode("").tag(sync=True)  # the winner and its prediction
    result_for = t.Unicode("").tag(sync=True)  # the settings the result shown was searched with
    seconds = t.Float(0.0).tag(sync=True)  # how long that search took
    note = t.Unicode("").tag(sync=True)  # presets skipped, the time budget that ran out
    error = t.Unicode("").tag(sync=True)
    stale = t.Bool(False).tag(sync=True)  # the result shown is not for the settings as they are now
    version = t.Int(0).tag(sync=True)  # +1 after every successful search
    editor_ref = t.Unicode("").tag(sync=True)  # "anywidget:<model id>" of the editor the result opened in
    editor_note = t.Unicode("").tag(sync=True)

    def __init__(self, source: StrategyEditor | ModelBuilder | BuiltModel | torch.nn.Module, inputs: Any = None, *,
                 target: torch.Tensor | None = None, loss_fn: Callable | None = None, optimizer: str = "sgd",
                 lr: float = 0.1, momentum: float = 0.0, hardware: str = "h100_node", devices: int = 8,
                 memory_limit: str | float | None = None, method: str = "auto", time_budget: str | float | None = None,
                 seed: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.editor: StrategyEditor | None = None  # where "open in editor" shows the result
        self.builder: ModelBuilder | None = None
        self._model: BuiltModel | None = None
        self.result: SearchResult | None = None
        self._result_inputs: dict[str, Any] | None = None
        self._sent = 0.0
        self._busy = True
        if isinstance(source, StrategyEditor):
            self.editor = source
        elif isinstance(source, ModelBuilder):
            self.builder = source
        elif isinstance(source, BuiltModel):
            self._model = source
        elif isinstance(source, torch.nn.Module):
            self._model = BuiltModel.from_module(source, inputs, target, loss_fn, 'SearchPanel')
        else:
            raise TypeError(f"SearchPanel needs a StrategyEditor, a ModelBuilder, a BuiltModel or a torch module, "
                            f"got {type(source).__name__}")
        self._optimizer = (optimizer, lr, momentum)
        strategy_form.make_optimizer(optimizer, lr, momentum)  # a bad optimizer fails here, not at the first search
        with self.hold_trait_notifications():
            self.hardware, self.devices, self.method, self.seed = hardware, devices, method, seed
            self.memory_limit = _text(memory_limit)
            self.time_budget = _text(time_budget)
        self._busy = False
        self._check_inputs()

    # --- the model and the optimizer searched for ---------------------------------------------------
    def model(self) -> BuiltModel:
        m = self.editor.model if self.editor is not None else self.builder.model if self.builder is not None \
            else self._model
        if m is None:
            raise ValueError(f"no model to search yet: {self.builder.error if self.builder else 'give one'}")
        return m

    def optimizer_def(self):
        """The optimizer the training graph is built with: the editor's, else the one given."""
        if self.editor is not None:
            return self.editor.optimizer_def()
        return strategy_form.make_optimizer(*self._optimizer)

    # --- inputs ----------------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The search's arguments the inputs stand for, checked: a ValueError says which input is wrong."""
        if self.method not in form.METHODS:
            raise ValueError(f"method {self.method!r}: pick one of {', '.join(form.METHODS)}")
        if self.devices < 1:
            raise ValueError(f"devices must be at least 1, got {self.devices}")
        return {"hardware": form.hardware_choice(self.hardware, self.devices), "devices": self.devices,
                "memory_limit": form.parse_bytes(self.memory_limit), "method": self.method,
                "time_budget": form.parse_seconds(self.time_budget), "seed": self.seed}

    @t.observe(*INPUTS)
    def _on_input(self, change: dict) -> None:
        if not self._busy:
            self._check_inputs()

    def _check_inputs(self) -> None:
        """A typed value that cannot be searched shows its error at once; the last result stays."""
        try:
            self.settings()
        except ValueError as e:
            self.error = error_text(e)
        else:
            self.error = ""
        self.stale = self.result is not None and (bool(self.error) or self._inputs() != self._result_inputs)

    def _inputs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in INPUTS}

    # --- a search -----------------------------------------------------------------------------------------
    @t.observe("search_requests")
    def _on_search_click(self, change: dict) -> None:
        if change["new"] > change["old"]:
            self.search()

    def search(self) -> SearchResult | None:
        """Run ``sl.search`` with the panel's settings. Never raises: a failure becomes ``error`` and the
        last good result stays shown (``stale``)."""
        self.error = ""
        self.status, self.phase, self.progress, self.units_done, self.units_total = "searching", "", 0.0, 0, 0
        self.best_ms, self.best_label, self._sent = None, "", 0.0
        inputs = self._inputs()
        try:
            args = self.settings()
            m = self.model()
            res = search(m.module, m.inputs, loss_fn=m.loss_fn, target=m.target, optimizer=self.optimizer_def(),
                         on_progress=self._on_progress, **args)
        except Exception as e:  # shown inline; the search's errors say what was wrong and what would be valid
            with self.hold_sync():
                self.error, self.status, self.phase = error_text(e), "failed", ""
                self.progress, self.units_done, self.units_total = 0.0, 0, 0  # no part-filled bar beside a failure
                self.best_ms, self.best_label = None, ""
                self.stale = self.result is not None
            return None
        self.result, self._result_inputs = res, inputs
        self._show(res, args, m)
        return res

    def _on_progress(self, p: SearchProgress) -> None:
        now = time.perf_counter()
        if p.phase != "done" and p.phase == self.phase and now - self._sent < PROGRESS_EVERY_S:
            return  # the page gets a few updates a second, not one per space solved
        self._sent = now
        with self.hold_sync():
            self.phase, self.progress, self.units_done, self.units_total = p.phase, p.fraction, p.done, p.total
            self.best_ms = p.best_time * 1e3 if p.best_time < float("inf") else None
            self.best_label = p.best

    def _show(self, res: SearchResult, args: dict[str, Any], m: BuiltModel) -> None:
        limit = args["memory_limit"]
        budget = args["time_budget"]
        notes = list(res.notes)
        if res.best_so_far:
            notes.insert(0, "the time budget ran out: this is the best found so far")
        with self.hold_sync():
            self.rows = form.result_rows(res)
            self.table_text, self.explanation = res.table(), res.explain()
            self.summary = f"{res.best.describe()}: {res.predicted}"
            self.result_for = (f"{m.name} on {args['hardware'].name}, {args['devices']} devices, "
                               f"method {args['method']}, "
                               + (f"memory limit {fmt_bytes(limit)}/device" if limit else "no memory limit")
                               + (f", time budget {budget:g} s" if budget else ""))
            self.seconds, self.note = res.seconds, "\n".join(notes)
            self.model_name = m.name
            self.status, self.phase, self.progress, self.stale = "done", "done", 1.0, False
            # an editor opened on an older search's result would sit under these rows as if it were theirs
            self.editor_ref, self.editor_note = "", ""
            self.version += 1

    def static_html(self) -> str:
        """The last search's winner and its table, or the settings it would search with."""
        least = [">=" if r.get("at_least") else "" for r in self.rows]  # a floor, not simulated (SearchResult.rows)
        rows = [(r["strategy"], r["model"], f"{m}{r['ms']:.4g}", fmt_bytes(r["memory"]),
                 "-" if r["ratio"] is None else f"{m}{r['ratio']:.2f}x") for r, m in zip(self.rows, least)]
        return static.card(f"SearchPanel: {self.summary or 'not searched yet'}", [
            static.line(f"for {self.result_for}" if self.result_for else ""), static.line(self.error),
            static.table(("strategy", "model", "ms/step", "memory", "vs chosen"), rows)])

    # --- the result in the StrategyEditor ----------------------------------------------------------------------
    @t.observe("open_requests")
    def _on_open_click(self, change: dict) -> None:
        if change["new"] > change["old"]:
            try:
                self.open_in_editor()
            except Exception as e:  # noqa: BLE001 - shown inline, never raised from an observer
                self.error = error_text(e)

    def open_in_editor(self) -> StrategyEditor:
        """Show the searched strategy in the StrategyEditor given (else a new one) and return it."""
        if self.result is None:
            raise ValueError("nothing to open yet: run a search first")
        res = self.result
        s = form.editor_settings(res.best)
        ed = self.editor
        if ed is None:
            kind, lr, momentum = self._optimizer
            source = self.builder if self.builder is not None else self.model()
            ed = StrategyEditor(source, preset="pipeline", mesh=s.mesh, micro_batches=s.micro_batches, stages=s.stages,
                                inner="none", optimizer=kind, lr=lr, momentum=momentum, hardware=res.hardware)
        else:
            ed.hardware = res.hardware  # its prediction is then for the machine the search chose for
        ed.configure(**s.inputs())
        if ed.error:
            raise ValueError(f"the StrategyEditor could not take the searched strategy: {ed.error}")
        self.editor = ed
        with self.hold_sync():
            self.editor_ref = f"anywidget:{ed.model_id}"
            self.editor_note = (f"{res.best.describe()} in the StrategyEditor: preset 'pipeline' with "
                                f"{s.stages} stage(s) and nothing inside (it adds no hints), the searched signature "
                                f"of {len(s.choices)} forward ops and {len(s.hints)} storage hints")
        return ed


def _text(value: str | float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else repr(float(value))
