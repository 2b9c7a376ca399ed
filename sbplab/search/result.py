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

    @property
    def strategy(self) -> Strategy:
        """An ordinary Strategy: ``sl.compile(model, ..., strategy=res.strategy)`` takes it unchanged."""
        return self.best.strategy

    def best_preset(self) -> Candidate | None:
        """The fastest preset: by ``sl.simulate`` among those the re-rank simulated (when the chosen
        strategy was simulated too), else by the analytic model."""
        fits = [p for p in self.presets if p.step_time < float("inf")]
        simulated = [p for p in fits if p.simulated_time is not None]
        if simulated and self.best.simulated_time is not None:
            return min(simulated, key=lambda p: p.simulated_time)
        return min(fits, key=lambda p: p.step_time) if fits else None

    def listed(self) -> list[Candidate]:
        """The chosen strategy, then every other preset, fastest first (analytic): the rows of ``table()``."""
        return [self.best] + sorted((p for p in self.presets if p is not self.best), key=lambda p: p.step_time)

    def table(self) -> str:
        """The searched strategy and every applicable preset, by predicted step time and memory."""
        measured = any(c.measured_time is not None for c in self.listed())
        rows = [("strategy", "analytic ms", "memory/device", "simulated ms", *(("measured ms",) if measured else ()),
                 "vs searched")]
        base = self.best.step_time
        for c in self.listed():
            sim = f"{c.simulated_time * 1e3:.4g}" if c.simulated_time is not None else "-"
            meas = (f"{c.measured_time * 1e3:.4g}" if c.measured_time is not None else "-",) if measured else ()
            rel = f"{c.step_time / base:.2f}x" if base > 0 else "-"
            rows.append((c.describe(), f"{c.step_time * 1e3:.4g}", fmt_bytes(c.memory), sim, *meas, rel))
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w[i]) if i == 0 else v.rjust(w[i]) for i, v in enumerate(r)) for r in rows]
        head = f"sl.search({self.method}) in {self.seconds:.2f} s" + \
            (" -- time budget ran out: best so far" if self.best_so_far else "")
        return "\n".join([head, *lines])

    def explain(self, limit: int = 20) -> str:
        """Op by op, where the searched strategy differs from the best preset and what each change saves
        (the op's compute, synchronisation and incoming boxing, both priced by the analytic model)."""
        p = self.best_preset()
        b = self.best
        lines = [f"searched: {b.describe()}: {b.step_time * 1e3:.4g} ms/step, {fmt_bytes(b.memory)}/device"]
        if p is None:
            return "\n".join(lines + ["no preset applies to compare with"])
        if p is b:
            return "\n".join(lines + ["this is the best preset itself: sl.simulate predicted no searched candidate "
                                      "faster (see notes)"])
        lines.append(f"best preset: {p.describe()}: {p.step_time * 1e3:.4g} ms/step, {fmt_bytes(p.memory)}/device "
                     f"(saves {(p.step_time - b.step_time) * 1e3:.4g} ms/step, "
                     f"{(1 - b.step_time / p.step_time) * 100 if p.step_time > 0 else 0:.1f}%)")
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
        for saved, name, old, new in diffs[:limit]:
            lines.append(f"  {name}: preset [{old}], searched [{new}]: saves {saved * 1e6:.3g} us/step")
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


