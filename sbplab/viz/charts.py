"""Per-device memory and communication of a compiled plan, as plotly bar charts and a text table.

Memory bars stack exactly the terms of ``RankMemory.peak`` (parameters, gradients, optimizer state and
activations at the peak, the simulator's register lifetimes), so the top of each bar is the peak. Communication bars stack the bytes
each rank sends per step by phase and collective, counting per-micro-batch collectives once per
micro-batch, so they add up to ``PhysicalGraph.comm_bytes_per_rank``.
"""

from __future__ import annotations

from typing import Any

from ..fmt import fmt_bytes
from .colors import category_color

MEMORY_PARTS = (  # (label, colour, Okabe-Ito); their sum is RankMemory.peak
    ("parameters", "#0072b2"),
    ("gradients", "#009e73"),
    ("optimizer state", "#cc79a7"),
    ("activation peak", "#e69f00"),
    ("micro-batches in flight", "#f0e442"),
)


def memory_parts(m: Any) -> dict[str, int]:
    """The stacked terms of one rank's peak memory."""
    in_flight = (m.micro_batches_in_flight - 1) * m.forward_activations
    return dict(zip([p for p, _ in MEMORY_PARTS],
                    [m.params, m.grads, m.optimizer_state, m.activations_peak, in_flight]))


def memory_chart(report: Any, title: str = "memory per device") -> Any:
    """Stacked bars per rank from a ``MemoryReport``; hover shows bytes and the gradient share."""
    import plotly.graph_objects as go

    ranks = sorted(report.ranks)
    fig = go.Figure()
    for part, color in MEMORY_PARTS:
        ys = [memory_parts(report.ranks[r])[part] for r in ranks]
        if not any(ys):
            continue
        fig.add_trace(go.Bar(
            x=[f"rank {r}" for r in ranks], y=ys, name=part, marker_color=color,
            customdata=[fmt_bytes(y) for y in ys],
            hovertemplate=f"{part}: %{{customdata}}<extra>%{{x}}</extra>"))
    peaks = [report.ranks[r].peak for r in ranks]
    fig.update_layout(barmode="stack", title=f"{title}: peak {fmt_bytes(max(peaks, default=0))}",
                      yaxis_title="bytes", legend_title_text="held for", height=380)
    return fig


def comm_by_rank(phys: Any) -> dict[int, dict[tuple[str, str], int]]:
    """rank -> (phase, collective kind) -> bytes sent per step."""
    out: dict[int, dict[tuple[str, str], int]] = {r: {} for r in phys.ranks}
    for c in phys.collectives:
        k = phys.micro_batches if c.when == "each" else 1
        for r, b in c.bytes_sent.items():
            key = (c.phase, c.kind)
            out[r][key] = out[r].get(key, 0) + k * b
    return out


def comm_chart(phys: Any, title: str = "bytes sent per device per step") -> Any:
    """Stacked bars per rank, a colour per (phase, collective) from a colour-blind-safe palette."""
    import plotly.graph_objects as go

    per = comm_by_rank(phys)
    ranks = sorted(per)
    keys = sorted({k for v in per.values() for k in v})
    fig = go.Figure()
    for i, (phase, kind) in enumerate(keys):
        ys = [per[r].get((phase, kind), 0) for r in ranks]
        fig.add_trace(go.Bar(
            x=[f"rank {r}" for r in ranks], y=ys, name=f"{phase} {kind}",
            marker_color=category_color(i),
            customdata=[fmt_bytes(y) for y in ys],
            hovertemplate=f"{phase} {kind}: %{{customdata}}<extra>%{{x}}</extra>"))
    total = sum(sum(v.values()) for v in per.values())
    fig.update_layout(barmode="stack", title=f"{title}: {fmt_bytes(total)} in all", yaxis_title="bytes",
                      legend_title_text="phase, collective", height=380)
    return fig


def comm_rows(phys: Any) -> list[dict[str, Any]]:
    """One row per collective in the global order: what, who, on which mesh axis, how many bytes."""
    rows = []
    for c in phys.collectives:
        per_step = phys.micro_batches if c.when == "each" else 1
        rows.append({
            "index": c.index, "phase": c.phase, "kind": c.kind + (f"({c.reduce_op})" if c.reduce_op else ""),
            "group": tuple(c.group), "mesh_axis": "move" if c.mesh_axis is None else c.mesh_axis,
            "bytes_per_rank": max(c.bytes_sent.values(), default=0), "times_per_step": per_step,
            "bytes_per_step": per_step * sum(c.bytes_sent.values()), "when": c.when,
        })
    return rows


def comm_table(phys: Any) -> str:
    """The communication table as aligned text (what ``report.html`` and the widgets show)."""
    head = ("#", "phase", "collective", "group", "axis", "max sent/rank", "x/step", "total/step")
    body = [(str(r["index"]), r["phase"], r["kind"], "(" + ",".join(map(str, r["group"])) + ")",
             str(r["mesh_axis"]), fmt_bytes(r["bytes_per_rank"]), str(r["times_per_step"]),
             fmt_bytes(r["bytes_per_step"])) for r in comm_rows(phys)]
    rows = [head, *body]
    w = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(x) for v, x in zip(row, w)).rstrip() for row in rows)
