"""The StrategyEditor's prediction: ``sl.simulate`` of its compiled step on a ``Hardware``, sent last.

After every recompute the editor sends the numbers, then the graph picture, then this prediction,
each in a message of its own, so the page shows what is quick first. Simulating is quick; lowering
the step to its actor plan first (``compiled.plan()``, which the simulator replays) grows with the
square of the plan: on a 12-layer GPT on 4 ranks it takes seconds. A step of more than
``predict_limit`` op instances is therefore predicted only on request (the page's predict button,
``editor.predict()``), so a click on a big model stays quick. ``RunPanel`` takes the editor's
prediction when it is for the same Hardware, and runs the plan it simulated.
"""

from __future__ import annotations

import time

import traitlets as t

from ..compiler.api import Compiled
from ..hardware import Hardware
from ..sim import Prediction
from .messages import error_text
from .prediction_view import check_hardware, predict, prediction_state
from .widget_base import SbplabWidget


class EditorPrediction(SbplabWidget):
    """The prediction traits and methods of ``StrategyEditor``, which provides ``compiled``, ``version``,
    ``timings_ms``, ``_busy`` and ``_guard`` (run a function with its changes sent as one message)."""

    auto_predict = t.Bool(True).tag(sync=True)  # simulate after every recompute (else on predict_requests)
    predict_limit = t.Int(1500).tag(sync=True)  # auto-predict steps of at most this many op instances; 0: any
    predict_requests = t.Int(0).tag(sync=True)  # the page's predict button adds one
    hardware_name = t.Unicode("").tag(sync=True)  # the Hardware the prediction is for
    predicted = t.Dict().tag(sync=True)  # prediction_view.prediction_state: step_ms, ranks (peak, breakdown)
    predicted_version = t.Int(0).tag(sync=True)  # the version the prediction shown is for
    predictions = t.Int(0).tag(sync=True)  # +1 after every prediction (a RunPanel follows it)
    predict_error = t.Unicode("").tag(sync=True)  # why the simulator could not predict this step
    predict_note = t.Unicode("").tag(sync=True)  # why this step was not predicted automatically

    compiled: Compiled | None

    def _set_hardware(self, hw: Hardware | None) -> None:
        self._hardware = check_hardware(Hardware.cpu_box() if hw is None else hw)
        self.hardware_name = self._hardware.name
        self.prediction: Prediction | None = None  # sl.simulate(self.compiled, self.hardware), once computed

    @property
    def hardware(self) -> Hardware:
        """What the prediction is for: ``Hardware.cpu_box()`` unless given (a calibrated one, a preset)."""
        return self._hardware

    @hardware.setter
    def hardware(self, hw: Hardware) -> None:
        had = self.predicted_version == self.version and bool(self.predicted)  # asked for, or automatic
        self._set_hardware(check_hardware(hw))
        if self.compiled is not None and (had or self._auto_predicts()):
            self._guard(self._predict, keep_error=True)
        elif self.compiled is not None:
            self.predicted = {}  # it was for the old Hardware

    def predict(self) -> Prediction | None:
        """Simulate the compiled step on ``hardware`` now (the page's predict button does this), or give
        the prediction already made; None while the settings have an error."""
        if self.prediction is None and self.compiled is not None:
            self._guard(self._predict, keep_error=True)
        return self.prediction

    def _auto_predicts(self) -> bool:
        """Whether a recompute predicts by itself: on, and the step small enough (``predict_limit``)."""
        c = self.compiled
        return bool(self.auto_predict and c is not None
                    and (self.predict_limit <= 0 or len(c.physical.nodes) <= self.predict_limit))

    def _note_limit(self) -> None:
        c, limit = self.compiled, self.predict_limit
        n = 0 if c is None else len(c.physical.nodes)
        self.predict_note = (f"not predicted automatically: {n} op instances are more than predict_limit ({limit}); "
                             f"lowering them to actors and simulating takes seconds, so press predict"
                             if self.auto_predict and 0 < limit < n else "")

    def _after_recompute(self) -> None:
        """In the recompute's first message: the new step's prediction is pending, or not coming."""
        self._note_limit()
        if not self._auto_predicts():
            self.predicted, self.predict_error = {}, ""  # nothing predicted for these settings

    @t.observe("auto_predict", "predict_limit")
    def _on_auto_predict(self, change: dict) -> None:
        if getattr(self, "_busy", True) or self.compiled is None:  # True: still being constructed
            return
        self._note_limit()  # a prediction already made stays: it is still the step's
        if self._auto_predicts():
            self.predict()

    @t.observe("predict_requests")
    def _on_predict_click(self, change: dict) -> None:
        if change["new"] > change["old"] and not getattr(self, "_busy", True):
            self.predict()

    def _predict(self, timed: bool = False) -> None:
        """``sl.simulate`` of the compiled step on ``hardware``; a failure is ``predict_error``, never the
        editor's error (the step itself compiled). ``timed``: the last step of a recompute."""
        c = self.compiled
        if c is None:
            return
        t0 = time.perf_counter()
        try:
            pred, parts = predict(c, self._hardware)
        except Exception as e:  # noqa: BLE001 - shown beside the prediction, never raised from an observer
            self.prediction, self.predicted, self.predict_error = None, {}, error_text(e)
            parts = {}
        else:
            self.prediction, self.predicted, self.predict_error = pred, prediction_state(pred), ""
        self.predicted_version = self.version
        self.predictions += 1
        if timed and "shown" in self.timings_ms:
            ms = dict(self.timings_ms)
            took = (time.perf_counter() - t0) * 1e3
            ms.update({k: round(v, 2) for k, v in parts.items()}, predict=round(took, 2),
                      total=round(ms["total"] + took, 2))
            self.timings_ms = ms
