"""Predicted against measured: the same plan simulated and run, side by side.

Three views, each with relative errors (predicted / measured - 1):
- per step: the prediction's steady-state step time against every measured step (``step_times``);
- per rank and lane: busy seconds per step on the compute and the comm lane;
- per kind of actor (compute op or communication kind): seconds per step summed over ranks;
- per rank, peak memory: the simulated peak against the run's measured one (``RunResult.memory``).
Measured lanes count the steps after the first, like the prediction, when a run has several.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..fmt import fmt_bytes
from ..runtime.trace import Trace

if TYPE_CHECKING:
    from ..runtime.results import RunResult
    from .prediction import Prediction


@dataclass
class PredictedVsMeasured:
    """``data`` holds the numbers (seconds); ``table()`` (and ``str``) a short text view."""

    data: dict = field(default_factory=dict)

    def table(self, top: int = 8) -> str:
        d = self.data
        lines = [f"step time: predicted {d['step_time']['predicted'] * 1e3:.3f} ms, measured "
                 f"{d['step_time']['measured'] * 1e3:.3f} ms (median of steps after the first), "
                 f"error {d['step_time']['error']:+.0%}",
                 "measured per step (ms): " + ", ".join(f"{t * 1e3:.3f}" for t in d["measured_steps"]),
                 f"{'rank':>4} {'lane':8s} {'pred ms':>9} {'meas ms':>9} {'error':>7}"]
        for row in d["lanes"]:
            lines.append(f"{row['rank']:>4} {row['lane']:8s} {row['predicted'] * 1e3:>9.3f} "
                         f"{row['measured'] * 1e3:>9.3f} {_pct(row['error']):>7}")
        lines.append(f"{'kind':28s} {'pred ms':>9} {'meas ms':>9} {'error':>7}")
        for row in sorted(d["kinds"], key=lambda x: -x["measured"])[:top]:
            lines.append(f"{row['kind'][:28]:28s} {row['predicted'] * 1e3:>9.3f} {row['measured'] * 1e3:>9.3f} "
                         f"{_pct(row['error']):>7}")
        if d.get("memory"):
            lines.append(f"{'rank':>4} {'pred peak':>12} {'meas peak':>12} {'error':>7}  measured by")
            lines += [f"{m['rank']:>4} {fmt_bytes(m['predicted']):>12} {fmt_bytes(m['measured']):>12} "
                      f"{_pct(m['error']):>7}  {m['source']}" for m in d["memory"]]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _pct(e: float) -> str:
    return "n/a" if e != e else f"{e:+.0%}"


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1.0 if meas > 0 else float("nan")


def _per_step_busy(trace: Trace, first_step: int, n_steps: int) -> tuple[dict, dict]:
    """(rank, lane) -> seconds per step, and kind -> seconds per step, over steps >= first_step."""
    lanes: dict[tuple[int, str], float] = defaultdict(float)
    kinds: dict[str, float] = defaultdict(float)
    for e in trace.events:
        if e.step < first_step or e.step >= first_step + n_steps:
            continue
        lanes[(e.rank, e.lane)] += e.dur / 1e6 / n_steps
        kinds[e.op] += e.dur / 1e6 / n_steps
    return lanes, kinds


def compare(pred: Prediction, result: RunResult) -> PredictedVsMeasured:
    """Line up ``pred`` with a real ``result`` of the same plan (the structure must match)."""
    measured_steps = list(result.step_times)
    if not measured_steps:
        raise ValueError("the run has no trace to compare with; run with trace=True")
    later = sorted(measured_steps[1:] or measured_steps)
    meas = later[len(later) // 2]
    first = 1 if len(measured_steps) > 1 else 0
    n_meas = max(len(measured_steps) - first, 1)
    p_first = 1 if pred.steps > 1 else 0
    p_lanes, p_kinds = _per_step_busy(pred.trace, p_first, max(pred.steps - p_first, 1))
    m_lanes, m_kinds = _per_step_busy(result.trace, first, n_meas)
    lanes = [{"rank": r, "lane": lane, "predicted": p_lanes.get((r, lane), 0.0),
              "measured": m_lanes.get((r, lane), 0.0),
              "error": _err(p_lanes.get((r, lane), 0.0), m_lanes.get((r, lane), 0.0))}
             for r, lane in sorted(set(p_lanes) | set(m_lanes))]
    kinds = [{"kind": k, "predicted": p_kinds.get(k, 0.0), "measured": m_kinds.get(k, 0.0),
              "error": _err(p_kinds.get(k, 0.0), m_kinds.get(k, 0.0))} for k in sorted(set(p_kinds) | set(m_kinds))]
    memory = [{"rank": r, "predicted": pred.peak_memory[r], "measured": m.peak, "error": _err(pred.peak_memory[r], m.peak),
               "source": m.source, "predicted_breakdown": pred.memory_breakdown.get(r, {}),
               "measured_breakdown": m.breakdown} for r, m in sorted(getattr(result, "memory", {}).items())
              if r in pred.peak_memory]
    return PredictedVsMeasured({"step_time": {"predicted": pred.step_time, "measured": meas,
                                     "error": _err(pred.step_time, meas)},
                       "measured_steps": measured_steps, "lanes": lanes, "kinds": kinds, "memory": memory})
