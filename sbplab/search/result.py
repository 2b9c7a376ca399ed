"""What ``sl.search`` returns: the chosen Strategy, its prediction, and the comparison with the presets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..compiler.deduction.strategy import Strategy
from ..fmt import fmt_bytes
from ..hardware import Hardware
from .candidate import Candidate


@dataclass(frozen=True)
class Predicted:
    """The chosen strategy's step time and peak memory per device, and which model said so."""

    step_time: float  # seconds
    peak_memory: int  # bytes per device
    source: str  # "simulator" (sl.simulate on the compiled step) or "analytic" (the search's cost model)
    analytic_step_time: float
    analytic_memory: int

    def __str__(self) -> str:
        return (f"{self.step_time * 1e3:.4g} ms/step, {fmt_bytes(self.peak_memory)}/device ({self.source}; "
                f"analytic {self.analytic_step_time * 1e3:.4g} ms, {fmt_bytes(self.analytic_memory)})")


@dataclass(frozen=True)
class Figure:
    """A strategy's step time and memory per device as one model gives them, and which model that is.

    Why: a table that mixes models (a simulated winner beside analytic presets) can show a preset at
    0.89x of the winner it lost to. Every figure a search result shows comes from one of these, taken in
    the model that chose the winner wherever the strategy has a figure from it."""

    model: str  # "measured", "simulated" or "analytic"
    step_time: float  # seconds
    memory: int  # bytes per device (the simulator's peak where simulated, else the analytic model's)
    memory_model: str  # "simulated" or "analytic": measured runs give no memory here
    at_least: bool = False  # not simulated: ``step_time`` is the floor sl.simulate cannot go below (``sim_floor.py``)

    @property
    def label(self) -> str:
        model = f"{self.model} floor" if self.at_least else self.model
        return model if self.memory_model == self.model else f"{model}; memory {self.memory_model}"


MODELS = ("measured", "simulated", "analytic")  # the more trusted first


def figure_of(c: Candidate, model: str) -> Figure | None:
    """``c``'s figure in ``model``, or None where ``c`` has none from it."""
    sim_mem = c.simulated_memory is not None
    if model == "measured" and c.measured_time is not None:
        return Figure("measured", c.measured_time, c.simulated_memory if sim_mem else c.memory,
                      "simulated" if sim_mem else "analytic")
    if model == "simulated" and c.simulated_time is not None:
        return Figure("simulated", c.simulated_time, int(c.simulated_memory or 0), "simulated")
    if model == "simulated" and c.sim_floor is not None:  # skipped by the re-rank: at least its floor
        return Figure("simulated", c.sim_floor, c.memory, "analytic", at_least=True)
    if model == "analytic":
        return Figure("analytic", c.step_time, c.memory, "analytic")
    return None


@dataclass
class SearchResult:
    best: Candidate
    predicted: Predicted
    hardware: Hardware  # the chosen mesh's view of the hardware: compile and simulate with it
    candidates: list[Candidate]  # every searched candidate, cheapest first (analytic)
    presets: list[Candidate]  # every applicable preset, priced by the same cost model
    history: list[tuple[str, float, float]]  # (method, seconds into the search, best step time so far)
    best_so_far: bool  # True: the time budget ran out before the search finished
    method: str
    seconds: float
    notes: list[str] = field(default_factory=list)  # presets or candidates that could not be priced, and why
    users: list[Candidate] = field(default_factory=list)  # the strategies given as ``candidates=``
    devices: int = 0  # the devices the search was given (0: not recorded)

    @property
    def strategy(self) -> Strategy:
        """An ordinary Strategy: ``sl.compile(model, ..., strategy=res.strategy)`` takes it unchanged."""
        return self.best.strategy

    @property
    def model(self) -> str:
        """The model that chose the winner: "measured", "simulated" or "analytic"."""
        if self.best.measured_time is not None:
            return "measured"
        return "simulated" if self.predicted.source == "simulator" else "analytic"

    def figure(self, c: Candidate) -> Figure:
        """``c``'s figures in the model that chose the winner, else in the best model ``c`` has one from."""
        for m in MODELS[MODELS.index(self.model):]:
            f = figure_of(c, m)
            if f is not None:
                return f
        raise AssertionError("every candidate has an analytic figure")

    def ratio(self, c: Candidate) -> float | None:
        """``c``'s step time over the chosen one's, both in the model that gives ``c``'s figure."""
        f = self.figure(c)
        mine = figure_of(self.best, f.model)
        return f.step_time / mine.step_time if mine is not None and mine.step_time > 0 else None

    def devices_used(self, c: Candidate) -> int:
        return c.mesh.size * c.n_stages

    def best_preset(self) -> Candidate | None:
        """The fastest preset in the model that chose the winner (the analytic one for presets that model
        has no figure of, only when none has)."""
        fits = [p for p in self.presets if p.step_time < float("inf")]
        if not fits:
            return None
        for m in MODELS[MODELS.index(self.model):]:
            have = [(f.step_time, p) for p in fits if (f := figure_of(p, m)) is not None]
            if have:
                return min(have, key=lambda x: x[0])[1]
        return None

    def listed(self) -> list[Candidate]:
        """The chosen strategy, then the user's candidates and every preset, fastest first in the best model
        each has a figure from (the chosen model's first): the rows of ``table()``."""
        rest = [c for c in (*self.users, *self.presets) if c is not self.best]
        return [self.best] + sorted(rest, key=lambda c: (MODELS.index(self.figure(c).model), self.figure(c).step_time))

    def rows(self) -> list[dict[str, Any]]:
        """``table()`` as data (the SearchPanel's rows): each figure with its model."""
        out = []
        for c in self.listed():
            f = self.figure(c)
            out.append({"strategy": c.describe(), "searched": c is self.best, "user": c.method == "user",
                        "model": f.label, "ms": f.step_time * 1e3, "memory": int(f.memory), "ratio": self.ratio(c),
                        "at_least": f.at_least,
                        "devices": self.devices_used(c),
                        "analytic_ms": c.step_time * 1e3,
                        "simulated_ms": None if c.simulated_time is None else c.simulated_time * 1e3})
        return out

    def table(self) -> str:
        """The chosen strategy, the user's candidates and every applicable preset: step time and memory per
        device, each in the model that chose the winner where it has a figure from it, and labelled."""
        rows = [("strategy", "model", "ms/step", "memory/device", "vs chosen")]
        for r in self.rows():
            name = r["strategy"] + (" (chosen)" if r["searched"] else "")
            if self.devices and r["devices"] < self.devices:
                name += f" [{r['devices']} of {self.devices} devices]"
            least = ">=" if r["at_least"] else ""  # not simulated: its floor
            rows.append((name, r["model"], f"{least}{r['ms']:.4g}", fmt_bytes(r["memory"]),
                         f"{least}{r['ratio']:.2f}x" if r["ratio"] is not None else "-"))
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w[i]) if i < 2 else v.rjust(w[i]) for i, v in enumerate(r)) for r in rows]
        head = (f"sl.search({self.method}) in {self.seconds:.2f} s; chosen by the {self.model} model"
                + (" -- time budget ran out: best so far" if self.best_so_far else ""))
        return "\n".join([head, *lines])

    def explain(self, limit: int = 20) -> str:
        """Op by op, where the chosen strategy differs from the best preset; the totals in the model that
        chose the winner, the per-op savings by the analytic model's op prices (no other model prices ops)."""
        p = self.best_preset()
        b = self.best
        fb = self.figure(b)
        lines = [f"chosen: {b.describe()}: {fb.step_time * 1e3:.4g} ms/step, {fmt_bytes(fb.memory)}/device "
                 f"({fb.label})"]
        if p is None:
            return "\n".join(lines + ["no preset applies to compare with"])
        if p is b:
            return "\n".join(lines + [f"this is the best preset itself: {self.model} step times put no searched "
                                       "candidate ahead of it (see notes)"])
        fp = self.figure(p)
        mine = figure_of(b, fp.model) or fb
        lines.append(f"best preset: {p.describe()}: {fp.step_time * 1e3:.4g} ms/step, {fmt_bytes(fp.memory)}/device "
                     f"({fp.label}; saves {(fp.step_time - mine.step_time) * 1e3:.4g} ms/step, "
                     f"{(1 - mine.step_time / fp.step_time) * 100 if fp.step_time > 0 else 0:.1f}%)")
        if b.method == "user" or b.problem is None:
            return "\n".join(lines)
        if b.mesh.shape != p.mesh.shape:
            lines.append(f"meshes differ ({'x'.join(map(str, b.mesh.shape))} vs {'x'.join(map(str, p.mesh.shape))}): "
                         f"signatures below are on different meshes")
        if b.zero != p.zero:
            lines.append(f"ZeRO level {b.zero} instead of {p.zero}")
        if b.n_stages != p.n_stages:
            lines.append(f"{b.n_stages} pipeline stage(s) instead of {p.n_stages}")
        bs, ps = b.signatures, p.signatures
        diffs = []
        for name, sig in bs.items():
            if name in ps and ps[name] != sig:
                saved = _op_price(p, name) - _op_price(b, name)
                diffs.append((saved, name, ps[name], sig))
        diffs.sort(key=lambda d: -d[0])
        if diffs:
            lines.append("ops that differ (each saving by the analytic model's op prices):")
        for saved, name, old, new in diffs[:limit]:
            lines.append(f"  {name}: preset [{old}], chosen [{new}]: saves {saved * 1e6:.3g} us/step (analytic)")
        if len(diffs) > limit:
            lines.append(f"  ... {len(diffs) - limit} more ops differ")
        if not diffs:
            lines.append("  every op has the preset's signature")
        return "\n".join(lines)

    def plot(self) -> Any:
        """Best step time found against search time, one line per method (plotly, imported here)."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for m in dict.fromkeys(h[0] for h in self.history):
            pts = [(t, c * 1e3) for k, t, c in self.history if k == m and c < float("inf")]
            fig.add_trace(go.Scatter(x=[t for t, _ in pts], y=[c for _, c in pts], mode="lines+markers", name=m,
                                     line_shape="hv"))
        fig.update_layout(title="best step time found over search time", xaxis_title="search time (s)",
                          yaxis_title="predicted step time (ms)")
        return fig

    def __repr__(self) -> str:
        return f"SearchResult({self.best.describe()}; {self.predicted})"


def _op_price(c: Candidate, name: str) -> float:
    """Seconds per step attributable to op ``name`` in candidate ``c``."""
    pr = c.problem
    k = pr.index[name]
    o, i = pr.ops[k], c.assign[k]
    t = pr.micro_batches * (o.compute[i] + o.gather[c.zero][i]) + o.sync[c.zero][i]
    for e in pr.edges:
        if e.dst == k:
            t += pr.micro_batches * e.cost[c.assign[e.src], i]
    return float(t)


