"""RunPanel: run the editor's compiled strategy for k steps, then the timeline and the check against torch.

"workers" runs on a ``LocalCluster`` (one real process per rank, Gloo), which hands back losses,
final parameters and a trace, and reports each step as it finishes (the bar and the loss so far
move per step, not per stage); "in-process" runs the same physical graph in the ``LocalExecutor``
(all ranks in this process: fast, no timeline). Either way the same steps then run in plain
single-device PyTorch and the panel shows both losses side by side and the largest differences.
The cluster stays up between runs (``close()`` stops it). Failures become the ``error`` trait.

Before a run the panel shows the simulator's prediction for the strategy (step time, peak memory
per rank) on ``hardware``: ``Hardware.cpu_box()``, the editor's Hardware, or a calibrated one given
to it; after a workers run, the measured step time beside it and the prediction's error, or, for a
prediction on another kind of machine than the run's (an H100 node beside CPU workers), that the two
are not comparable (``prediction_view.machine_mismatch``): no error figure. With an
editor that predicts after every change, the panel takes the editor's prediction instead of
simulating again.
"""

from __future__ import annotations

import time
from typing import Any

import traitlets as t

from ..compiler.api import Compiled
from ..hardware import Hardware
from ..sim import Prediction
from ..viz.plotly_theme import outputs
from ..viz.timeline import makespan_us, timeline, timeline_bars
from . import static_view as static
from ._assets import widget_module, widget_style
from .messages import error_text
from .prediction_view import check_hardware, measured_state, predict, prediction_state
from .run_check import NumericCheck, check_against_torch
from .strategy_editor import StrategyEditor
from .widget_base import SbplabWidget
from .zoo import BuiltModel

BACKENDS = ("workers", "in-process")
STAGES = {  # status -> progress shown when it starts; "running" then moves on step by step
    "lowering": 0.05, "starting workers": 0.15, "running": 0.3, "checking against torch": 0.85, "done": 1.0,
}


class RunPanel(SbplabWidget):
    """``RunPanel(editor, steps=3).run()``; ``panel.result`` is the runtime's RunResult."""

    _esm = widget_module("run_panel.js")
    _css = widget_style("run_panel.css")

    # --- inputs -------------------------------------------------------------------------------------
    steps = t.Int(3).tag(sync=True)
    backend = t.Unicode("workers").tag(sync=True)  # "workers" (LocalCluster) or "in-process"
    timeout = t.Float(60.0).tag(sync=True)  # seconds without progress before a run counts as hung
    tol = t.Float(1e-4).tag(sync=True)  # the check passes when losses and parameters differ by at most this
    run_requests = t.Int(0).tag(sync=True)  # the page's run button adds one

    # --- derived -------------------------------------------------------------------------------------
    backends = t.List(t.Unicode(), default_value=list(BACKENDS)).tag(sync=True)
    strategy_name = t.Unicode("").tag(sync=True)
    ranks = t.Int(0).tag(sync=True)
    stale = t.Bool(False).tag(sync=True)  # the strategy changed since the last run
    ran_for = t.Unicode("").tag(sync=True)  # the strategy the results shown are of ("" before a run)
    status = t.Unicode("idle").tag(sync=True)  # idle, lowering, starting workers, running, checking..., done, failed
    progress = t.Float(0.0).tag(sync=True)  # 0..1
    steps_done = t.Int(0).tag(sync=True)  # steps of the current run finished so far
    run_losses = t.List(t.Float(allow_none=True)).tag(sync=True)  # their losses, as each step finishes
    stage_ms = t.Dict().tag(sync=True)  # how long each stage took
    loss_rows = t.List(t.Dict()).tag(sync=True)  # step, run, torch, diff
    loss_diff = t.Float(0.0).tag(sync=True)
    param_diff = t.Float(0.0).tag(sync=True)
    worst_param = t.Unicode("").tag(sync=True)
    passed = t.Bool(False).tag(sync=True)
    timeline_ref = t.Unicode("").tag(sync=True)  # the model id of the Output widget the page draws the timeline in
    makespan_us = t.Float(0.0).tag(sync=True)
    firings = t.Int(0).tag(sync=True)
    wall_s = t.Float(0.0).tag(sync=True)
    note = t.Unicode("").tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    hardware_name = t.Unicode("").tag(sync=True)  # the Hardware the prediction is for
    predicted = t.Dict().tag(sync=True)  # prediction_view.prediction_state of the strategy; {} until known
    predict_error = t.Unicode("").tag(sync=True)  # why the simulator could not predict it
    measured = t.Dict().tag(sync=True)  # after a workers run: step_ms, steps_ms, predicted_ms, error
    compare_text = t.Unicode("").tag(sync=True)  # pred.compare(result).table(): per rank, lane and kind

    def __init__(self, source: StrategyEditor | Compiled, model: BuiltModel | None = None, optimizer: Any = None, *,
                 steps: int = 3, backend: str = "workers", cluster: Any = None, hardware: Hardware | None = None,
                 **kwargs: Any) -> None:
        super().__init__(steps=steps, backend=backend, **kwargs)
        self.editor = source if isinstance(source, StrategyEditor) else None
        self._compiled = source if isinstance(source, Compiled) else None
        if self.editor is None and self._compiled is None:
            raise TypeError(f"RunPanel needs a StrategyEditor or a Compiled step, got {type(source).__name__}")
        if self._compiled is not None and (model is None or optimizer is None):
            raise TypeError("RunPanel(compiled, model, optimizer): a Compiled step needs the BuiltModel and the "
                            "optimizer it was compiled with, for the check against torch")
        self._model, self._optimizer = model, optimizer
        self.cluster = cluster  # a LocalCluster of at least the plan's ranks, or None: made on the first run
        self._own_cluster = cluster is None
        self.result: Any = None  # RunResult (workers) or None
        self.timeline_output: Any = None  # the ipywidgets Output that shows the last workers run's timeline
        self.timeline_fig: Any = None  # that timeline's plotly Figure
        self._ran_compiled: Compiled | None = None
        self.check: NumericCheck | None = None
        self._ran_version = -1
        self._hardware = None if hardware is None else check_hardware(hardware)  # None: the editor's, or cpu_box
        self.prediction: Prediction | None = None
        self._predicted_for: Compiled | None = None  # the step self.prediction is of
        if self.editor is not None:
            self.editor.observe(self._on_strategy, names=["version", "error"])
            self.editor.observe(self._on_editor_prediction, names=["predictions"])
        self._describe()
        # a step the editor finds too big to predict on every change is predicted when it runs
        ed = self.editor
        big = ed is not None and ed.compiled is not None and 0 < ed.predict_limit < len(ed.compiled.physical.nodes)
        self._refresh_prediction(compute=not big)

    # --- the prediction --------------------------------------------------------------------------------
    @property
    def hardware(self) -> Hardware:
        """The Hardware predictions are for: the one given, else the editor's, else ``cpu_box()``."""
        if self._hardware is not None:
            return self._hardware
        return self.editor.hardware if self.editor is not None else Hardware.cpu_box()

    @hardware.setter
    def hardware(self, hw: Hardware | None) -> None:
        self._hardware = None if hw is None else check_hardware(hw)
        self._refresh_prediction(compute=True)

    def _on_editor_prediction(self, change: dict) -> None:
        self._refresh_prediction(compute=True)

    def _refresh_prediction(self, compute: bool) -> None:
        """Show the prediction of the current step on ``hardware``: the editor's when it has it for the
        same Hardware; otherwise simulated here if ``compute``, else left to come (the editor predicts
        after its other views) or to the run."""
        hw = self.hardware
        self.hardware_name = hw.name
        try:
            c = self.compiled()
        except ValueError:
            return  # the strategy has an error: the last prediction stays beside it
        if self.prediction is not None and self._predicted_for is c and self.prediction.hardware == hw:
            return
        ed = self.editor
        if ed is not None and ed.compiled is c and ed.prediction is not None and ed.prediction.hardware == hw:
            self._show_prediction(c, ed.prediction, "")
            return
        self.prediction, self._predicted_for, self.predicted, self.predict_error = None, None, {}, ""
        if compute:
            try:
                pred, _ = predict(c, hw)
            except Exception as e:  # noqa: BLE001 - shown beside the run, which may still work
                self._show_prediction(c, None, error_text(e))
            else:
                self._show_prediction(c, pred, "")

    def _show_prediction(self, c: Compiled, pred: Prediction | None, why: str) -> None:
        self.prediction, self._predicted_for = pred, c
        self.predicted, self.predict_error = ({} if pred is None else prediction_state(pred)), why

    # --- the source of the strategy --------------------------------------------------------------------
    def compiled(self) -> Compiled:
        if self.editor is None:
            return self._compiled  # type: ignore[return-value]
        if self.editor.compiled is None:
            raise ValueError(f"the strategy has an error, nothing to run: {self.editor.error}")
        return self.editor.compiled

    def _model_and_optimizer(self) -> tuple[BuiltModel, Any]:
        if self.editor is None:
            return self._model, self._optimizer  # type: ignore[return-value]
        return self.editor.model, self.editor.optimizer_def()  # type: ignore[return-value]

    def _on_strategy(self, change: dict) -> None:
        self._describe()
        self._refresh_prediction(compute=False)  # the editor's prediction follows its other views

    def _describe(self) -> None:
        try:
            c = self.compiled()
        except ValueError as e:
            self.strategy_name, self.ranks = "", 0
            self.note = str(e)
            self.stale = self._ran_version != -1  # results shown are of a strategy the editor no longer has
            return
        self.note = ""
        self.strategy_name, self.ranks = c.strategy.name, max(c.physical.ranks) + 1
        self.stale = self.editor is not None and self._ran_version not in (-1, self.editor.version)

    @t.observe("run_requests")
    def _on_click(self, change: dict) -> None:
        if change["new"] > change["old"]:
            self.run()

    # --- a run ---------------------------------------------------------------------------------------------
    def _stage(self, status: str, times: dict[str, float], started: list[float]) -> None:
        now = time.perf_counter()
        if started:
            times[self.status] = round((now - started[0]) * 1e3, 1)
            self.stage_ms = dict(times)
        started[:] = [now]
        self.status, self.progress = status, STAGES[status]

    def _on_step(self, step: int, steps: int, loss: float | None) -> None:
        """A step finished: the bar moves its share of the "running" stretch and its loss shows."""
        lo, hi = STAGES["running"], STAGES["checking against torch"]
        self.steps_done = step + 1
        self.run_losses = [*self.run_losses, None if loss is None else float(loss)]
        self.progress = lo + (hi - lo) * (step + 1) / steps

    def run(self) -> None:
        """Run ``steps`` training steps, then the check against PyTorch; never raises, sets ``error``."""
        times: dict[str, float] = {}
        started: list[float] = []
        self.error = ""
        self.loss_rows, self.timeline_ref, self.firings, self.makespan_us = [], "", 0, 0.0
        self.steps_done, self.run_losses = 0, []
        self.loss_diff = self.param_diff = self.wall_s = 0.0
        self.passed, self.worst_param, self.stage_ms, self.result, self.check = False, "", {}, None, None
        self.measured, self.compare_text, self.ran_for = {}, "", ""
        try:
            self._run(times, started)
        except Exception as e:  # shown inline; the message says what failed and where
            self.error = error_text(e)
            self.status = "failed"

    def _run(self, times: dict[str, float], started: list[float]) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: pick one of {', '.join(BACKENDS)}")
        self._stage("lowering", times, started)
        c = self.compiled()
        model, optimizer = self._model_and_optimizer()
        version = self.editor.version if self.editor is not None else 0
        feeds = c.feeds((*model.inputs, model.target))  # checked against the compiled shapes and dtypes
        n = max(c.physical.ranks) + 1
        self._refresh_prediction(compute=True)  # before the run, if the editor has not predicted it
        if self.backend == "workers":
            plan = c.plan()  # n ranks; the plan the prediction simulated, lowered once
            cluster = self._cluster(n, times, started)
            self._stage("running", times, started)
            t0 = time.perf_counter()
            self.result = cluster.run(plan, feeds, steps=self.steps, timeout=self.timeout, progress=False,
                                      on_step=self._on_step)
            losses, params = self.result.losses, self.result.full_params()
        else:
            self._stage("running", times, started)
            t0 = time.perf_counter()
            ex = c.executor()
            losses = []
            for step in range(self.steps):
                losses.append(ex.step(feeds))
                self._on_step(step, self.steps, losses[-1])
            params = ex.params()
        self.wall_s = time.perf_counter() - t0
        self._stage("checking against torch", times, started)
        self.check = check_against_torch(model, optimizer, losses, params)
        self.loss_rows = self.check.rows()
        self.loss_diff, self.param_diff = self.check.loss_diff, self.check.max_param_diff
        self.worst_param, self.passed = self.check.worst_param, self.check.passed(self.tol)
        if self.result is not None:
            bars = timeline_bars(self.result.trace)
            self.firings, self.makespan_us = len(bars), makespan_us(self.result.trace)
            self._ran_compiled = c  # the step the trace is of, whatever the editor shows next
            self._show_timeline(c)
            self.note = ""
            if self.prediction is not None:
                self.measured, self.compare_text = measured_state(self.prediction, self.result, self.cluster.device_type)
        else:
            self.note = "the in-process executor keeps no trace: run on workers to see the timeline"
        self._ran_version, self.stale, self.ran_for = version, False, f"{c.strategy.name} on {n} rank(s)"
        self._stage("done", times, started)

    def _cluster(self, n: int, times: dict[str, float], started: list[float]):
        from ..runtime import LocalCluster  # worker processes: imported only when a run needs them

        if self.cluster is not None and not self.cluster.closed and self.cluster.n >= n:
            return self.cluster
        if not self._own_cluster:
            raise ValueError(f"the plan needs {n} ranks but the cluster given has {self.cluster.n} (or is closed)")
        self._stage("starting workers", times, started)
        if self.cluster is not None:
            self.cluster.close()
        self.cluster = LocalCluster(n)
        return self.cluster

    def _show_timeline(self, c: Compiled) -> None:
        """The run's timeline, drawn in the page as ``sl.timeline`` draws it in a notebook (plotly's own
        output after the theme's stylesheet, ``plotly_theme.outputs``), inside an ipywidgets Output that
        the panel's view holds: one renderer, with its legend, zoom, hover, links, step markers and
        memory track, on the page's light or dark theme. A plotly FigureWidget would save plotly.js
        (5 MB) into the notebook; the Output saves the figure's JSON."""
        import ipywidgets

        self.timeline_fig = self.timeline_figure(c)
        if self.timeline_output is None:
            self.timeline_output = ipywidgets.Output()
        self.timeline_output.outputs = outputs(self.timeline_fig)
        self.timeline_ref = self.timeline_output.model_id

    def static_html(self) -> str:
        """The strategy and its prediction, then what the last run measured and how it compared to torch."""
        p = self.predicted
        pred = f"predicted on {p['hardware']}: {p['step_ms']:.4g} ms per step" if p.get("step_ms") is not None else ""
        check = (f"{'matches' if self.passed else 'differs from'} single-device PyTorch: max |loss diff| "
                 f"{self.loss_diff:.2e}") if self.loss_rows else ""
        rows = [(r["step"], f"{r['run']:.6f}", f"{r['torch']:.6f}", f"{r['diff']:.2e}") for r in self.loss_rows]
        return static.card(f"RunPanel: {self.strategy_name} on {self.ranks} rank(s)" if self.strategy_name
                           else "RunPanel", [static.line(pred), static.line(self.error), static.line(check, bold=True),
                                             static.table(("step", "parallel run", "PyTorch", "|diff|"), rows)])

    # --- for notebooks ----------------------------------------------------------------------------------
    def timeline_figure(self, compiled: Compiled | None = None):
        """The plotly timeline of the last workers run, every step with its marker (hover names the tensor
        a collective moves, SBPs before and after, bytes, duration): what the panel draws."""
        if self.result is None:
            raise ValueError("no trace yet: run on workers first")
        c = compiled if compiled is not None else self._ran_compiled
        name = c.strategy.name if c is not None else self.strategy_name
        return timeline(self.result, title=f"{name}, {self.result.steps} step(s)", compiled=c)

    def close(self) -> None:
        """Stop the worker processes this panel started, stop following the editor, and close the widget."""
        if self.timeline_output is not None:
            self.timeline_output.close()
            self.timeline_output = None
        if self.cluster is not None and self._own_cluster:
            self.cluster.close()
            self.cluster = None
        if self.editor is not None:
            self.editor.unobserve(self._on_strategy, names=["version", "error"])
            self.editor.unobserve(self._on_editor_prediction, names=["predictions"])
        super().close()
