"""What the StrategyEditor and the RunPanel show of the simulator: ``sl.simulate`` of a compiled step on a
``Hardware``, as plain dicts a page can draw, and the measured step time of a run beside it.

Both widgets predict the same way ``sl.simulate(compiled, hw)`` does, on the actor plan
``compiled.plan()`` (cached on the compiled step), so the RunPanel's run reuses the lowering the
prediction already paid for and compares against exactly the plan it ran.
"""

from __future__ import annotations

import time
from typing import Any

from ..compiler.api import Compiled
from ..hardware import Hardware
from ..sim import Prediction, simulate


def check_hardware(hw: Any) -> Hardware:
    """``hw`` itself if it is a Hardware; a TypeError that says what would do otherwise."""
    if not isinstance(hw, Hardware):
        raise TypeError(f"hardware must be an sl.Hardware (sl.Hardware.cpu_box(), .h100_node(), or a "
                        f"calibrated one from cluster.calibrate()), got {type(hw).__name__}")
    return hw


def predict(c: Compiled, hw: Hardware) -> tuple[Prediction, dict[str, float]]:
    """The prediction and where its time went: "plan" (lowering to actors, free once cached) and
    "simulate", in milliseconds."""
    t0 = time.perf_counter()
    c.plan()  # what simulate lowers: timed apart, since it dominates on big graphs
    t1 = time.perf_counter()
    pred = simulate(c, hw)
    t2 = time.perf_counter()
    return pred, {"plan": (t1 - t0) * 1e3, "simulate": (t2 - t1) * 1e3}


def _ms(seconds: float) -> float:
    """Seconds as milliseconds, a difference's rounding residue (idle = span - busy = 1.7e-18 s) as 0."""
    ms = seconds * 1e3
    return 0.0 if abs(ms) < 1e-9 else ms


def prediction_state(pred: Prediction) -> dict[str, Any]:
    """The page's view of a prediction: step time, the Hardware it is for, and per rank the predicted
    peak memory (with what it holds then) and where the step's time goes."""
    hw = pred.hardware
    ranks = []
    for r in sorted(pred.peak_memory):
        b = pred.breakdown[r]
        ranks.append({"rank": r, "peak": int(pred.peak_memory[r]),
                      "memory": {k: int(v) for k, v in pred.memory_breakdown[r].items()},
                      "compute_ms": _ms(b["compute"]), "comm_ms": _ms(b["exposed communication"]),
                      "idle_ms": _ms(b["idle"])})
    return {"step_ms": pred.step_time * 1e3, "hardware": hw.name, "origin": hw.origin,
            "measured_fraction": pred.measured_fraction, "ranks": ranks}


def machine_mismatch(hw: Hardware, device_type: str) -> str:
    """Why a prediction on ``hw`` says nothing about a run on ``device_type`` workers ("" when it may).

    A Hardware with ``cores`` models CPU ranks sharing one machine's cores (``cpu_box``, a CPU
    calibration); one without models a device per rank (the GPU presets). An H100 node's prediction
    against CPU processes would print an "error" of -100%: a difference of machines, not of the model.
    """
    cpu_model = hw.cores is not None
    if (device_type == "cpu") == cpu_model:
        return ""
    return (f"{hw.name} models {'CPU processes' if cpu_model else 'a GPU per rank'}, the run used "
            f"{device_type.upper()} workers")


def measured_state(pred: Prediction, result: Any, device_type: str = "cpu") -> tuple[dict[str, Any], str]:
    """A run's measured step time against the prediction (``pred.compare(result)``): the numbers for
    the page, and the comparison's text table (per rank and lane, per kind of actor). A prediction for
    another kind of machine than the run's (``machine_mismatch``) is shown beside it as such, with no
    error figure and no table: ``comparable`` is False and ``why`` says what differs."""
    cmp = pred.compare(result)
    st = cmp.data["step_time"]
    err = st["error"]
    why = machine_mismatch(pred.hardware, device_type)
    state = {"step_ms": st["measured"] * 1e3, "steps_ms": [s * 1e3 for s in cmp.data["measured_steps"]],
             "predicted_ms": st["predicted"] * 1e3, "error": None if err != err or why else err,
             "hardware": pred.hardware.name, "origin": pred.hardware.origin,
             "ran_on": f"{device_type.upper()} workers", "comparable": not why, "why": why}
    return state, "" if why else cmp.table()
