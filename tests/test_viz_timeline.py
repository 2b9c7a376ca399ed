"""The timeline draws exactly the trace's firings: one bar per event, at its time, in its row."""

from __future__ import annotations

import json

import pytest

from sbplab.viz.colors import KIND_COLORS, shade
from sbplab.viz.timeline import compare_timelines, event_kind, makespan_us, timeline, timeline_bars


def pipeline_trace(stages: int, micro: int, fwd: float, bwd: float, t0: float = 1_000_000.0) -> list[dict]:
    """A GPipe schedule as Chrome events: forward of every micro-batch, then backward, then update,
    with a send/recv on a comm lane between stages. Times follow the schedule's recurrences."""
    ev: list[dict] = []
    for r in range(stages):
        ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 0, "args": {"name": "compute"}})
        ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 1, "args": {"name": "comm"}})
    comm = 5.0
    f_end = {}
    for m in range(micro):
        for s in range(stages):
            ready = f_end.get((s - 1, m), t0) + (comm if s else 0)
            start = max(ready, f_end.get((s, m - 1), t0))
            f_end[(s, m)] = start + fwd
            ev.append({"ph": "X", "pid": s, "tid": 0, "name": f"fc{s}", "ts": start, "dur": fwd,
                       "args": {"op": "matmul", "actor": f"fc{s}", "micro_batch": m, "phase": "forward",
                                "sbp": "(S(0))", "bytes": 0}})
            if s + 1 < stages:
                ev.append({"ph": "X", "pid": s, "tid": 1, "name": "send", "ts": f_end[(s, m)], "dur": comm,
                           "args": {"op": "send", "actor": f"send{s}", "micro_batch": m, "bytes": 4096,
                                    "phase": "forward"}})
    b_end = {}
    last = max(f_end.values())
    for m in range(micro):
        for s in reversed(range(stages)):
            ready = b_end.get((s + 1, m), last) + (comm if s + 1 < stages else 0)
            start = max(ready, b_end.get((s, m - 1), last), f_end[(s, micro - 1)])
            b_end[(s, m)] = start + bwd
            ev.append({"ph": "X", "pid": s, "tid": 0, "name": f"fc{s}_grad", "ts": start, "dur": bwd,
                       "args": {"op": "matmul_grad", "actor": f"fc{s}_grad", "micro_batch": m,
                                "phase": "backward", "bytes": 0}})
    for s in range(stages):
        ev.append({"ph": "X", "pid": s, "tid": 0, "name": "sgd", "ts": b_end[(s, micro - 1)], "dur": 3.0,
                   "args": {"op": "sgd", "actor": f"sgd{s}", "phase": "update"}})
    ev.append({"ph": "s", "pid": 0, "tid": 1, "ts": t0 + 1, "id": 1, "name": "reg"})  # flow: not a bar
    return ev


def _fig_bars(fig) -> list[tuple[str, float, float, str]]:
    out = []
    for tr in fig.data:
        for x, base, y in zip(tr.x, tr.base, tr.y):
            out.append((y, float(base), float(x), tr.name))
    return sorted(out)


def test_bars_equal_trace_events():
    ev = pipeline_trace(stages=2, micro=3, fwd=10.0, bwd=20.0)
    fig = timeline(ev, title="gpipe")
    complete = [e for e in ev if e["ph"] == "X"]
    t0 = min(e["ts"] for e in complete)
    lanes = {0: "compute", 1: "comm"}
    expect = sorted((f"rank {e['pid']} · {lanes[e['tid']]}", e["ts"] - t0, e["dur"],
                     event_kind(e, lanes[e["tid"]])) for e in complete)
    assert _fig_bars(fig) == expect
    assert fig.layout.xaxis.type == "linear" and "us" in fig.layout.xaxis.title.text
    # rank 0 at the top: the category array is reversed (plotly draws bottom-up)
    assert list(fig.layout.yaxis.categoryarray) == ["rank 1 · compute", "rank 0 · comm", "rank 0 · compute"]


def test_kinds_colours_and_hover():
    ev = pipeline_trace(stages=2, micro=2, fwd=10.0, bwd=20.0)
    fig = timeline(ev)
    by_kind = {tr.name: tr for tr in fig.data}
    assert set(by_kind) == {"forward", "backward", "update", "communication"}
    assert len(by_kind["communication"].x) == 2  # one send per micro-batch from stage 0
    fwd = by_kind["forward"]
    mbs = [c[2] for c in fwd.customdata]
    assert list(fwd.marker.color) == [shade(KIND_COLORS["forward"], m) for m in mbs]
    assert len(set(fwd.marker.color)) == 2  # micro-batches 0 and 1 get different shades
    comm = by_kind["communication"]
    assert comm.customdata[0][0] == "send" and comm.customdata[0][4] == "4.1 KB"
    assert "SBP %{customdata[3]}" in fwd.hovertemplate and "duration" in fwd.hovertemplate


def test_begin_end_pairs_and_chrome_json_file(tmp_path):
    ev = [
        {"ph": "B", "pid": 0, "tid": 7, "name": "all_reduce", "ts": 100, "args": {"bytes": 64}},
        {"ph": "E", "pid": 0, "tid": 7, "ts": 150},
        {"ph": "X", "pid": 1, "tid": 0, "name": "relu", "ts": 120, "dur": 4, "args": {"phase": "backward"}},
        {"ph": "i", "pid": 1, "tid": 0, "name": "mark", "ts": 130},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    bars = timeline_bars(str(path))
    assert [(b.row, b.kind, b.start_us, b.dur_us) for b in bars] == [
        ("rank 0 · 7", "communication", 100.0, 50.0), ("rank 1 · 0", "backward", 120.0, 4.0)]
    assert makespan_us(path) == 50.0


class _Trace:  # anything with .events, like the runtime's Trace
    def __init__(self, events):
        self.events = events


def test_compare_two_strategies_on_one_time_scale():
    a = pipeline_trace(stages=2, micro=4, fwd=10.0, bwd=20.0)
    b = pipeline_trace(stages=2, micro=2, fwd=20.0, bwd=40.0, t0=5.0)
    fig = compare_timelines(_Trace(a), b, labels=("4 micro", "2 micro"))
    n_a = sum(e["ph"] == "X" for e in a)
    n_b = sum(e["ph"] == "X" for e in b)
    per_axis: dict[str, int] = {}
    for tr in fig.data:
        per_axis[tr.yaxis] = per_axis.get(tr.yaxis, 0) + len(tr.x)
    assert per_axis == {"y": n_a, "y2": n_b}
    assert fig.layout.xaxis2.matches == "x"  # shared time scale
    titles = [a.text for a in fig.layout.annotations]
    assert titles == [f"4 micro: {makespan_us(a):.0f} us", f"2 micro: {makespan_us(b):.0f} us"]
    assert makespan_us(a) < makespan_us(b)  # more micro-batches fill the pipeline bubble
    legends = [tr.showlegend for tr in fig.data]
    assert sum(legends) == len({tr.name for tr in fig.data})  # each kind once in the legend
    side = compare_timelines(a, b, arrange="side")
    assert side.layout.xaxis2.domain[0] > side.layout.xaxis.domain[1]


def test_bad_events_are_named():
    with pytest.raises(ValueError, match="event 0 .*'f'.* has no 'ts'"):
        timeline_bars([{"ph": "X", "name": "f", "dur": 1}])
    with pytest.raises(ValueError, match="complete event 0 .* has no 'dur'"):
        timeline_bars([{"ph": "X", "name": "f", "ts": 1}])
    with pytest.raises(ValueError, match="no matching begin"):
        timeline_bars([{"ph": "E", "pid": 0, "tid": 0, "ts": 1}])
    with pytest.raises(TypeError, match="trace event 0 is a int"):
        timeline_bars([3])
    with pytest.raises(ValueError, match="arrange must be"):
        compare_timelines([], [], arrange="grid")


def test_runtime_trace_object_goes_through_its_chrome_export():
    from sbplab.runtime.trace import Trace, TraceEvent

    ev = [TraceEvent(0, "compute", "fc1", "matmul", "compute", "forward", 0, 0, 0, 0.0, 10.0),
          TraceEvent(0, "comm", "ar1", "all_reduce", "collective", "backward", 0, -1, 0, 12.0, 30.0, 4096),
          TraceEvent(0, "comm", "ar2", "all_reduce", "collective", "backward", 0, -1, 0, 14.0, 20.0, 1024),
          TraceEvent(1, "compute", "fc1", "matmul", "compute", "forward", 0, 1, 1, 2.0, 9.0),
          TraceEvent(1, "compute", "sgd", "sgd", "compute", "update", 0, -1, 0, 31.0, 33.0)]
    trace = Trace(ev)
    bars = timeline_bars(trace)
    assert len(bars) == len(ev)
    got = sorted((b.rank, b.name, b.kind, b.start_us, b.dur_us, b.micro_batch) for b in bars)
    kinds = {"forward": "forward", "update": "update", "backward": "communication"}
    want = sorted((e.rank, e.actor, kinds[e.phase], e.start, e.end - e.start,
                   e.micro if e.micro >= 0 else None) for e in ev)
    assert got == want
    # overlapping all-reduces sit on two comm rows, as the Chrome export packs them
    assert {b.row for b in bars if b.rank == 0} == {"rank 0 · compute", "rank 0 · comm", "rank 0 · comm 1"}
    assert makespan_us(trace) == trace.span_us
    assert sorted(b.name for b in timeline_bars(trace.select(rank=1))) == ["fc1", "sgd"]


@pytest.mark.multiprocess
def test_bars_of_a_real_pipeline_run():
    import torch

    from sbplab.runtime import LocalCluster
    from sbplab.runtime.examples import pipeline_mlp

    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(8, 8, generator=g) * 0.3 for _ in range(2)]
    plan = pipeline_mlp(ws, lr=0.1, batch=16, micro_batches=4)
    batches = {"x": torch.randn(16, 8, generator=g), "t": torch.randn(16, 8, generator=g)}
    with LocalCluster(2) as cluster:
        trace = cluster.run(plan, batches, steps=2, progress=False).trace
    fig = timeline(trace)
    assert sum(len(tr.x) for tr in fig.data) == len(trace.events)
    t0 = min(e.start for e in trace.events)
    drawn = sorted((float(b), float(x)) for tr in fig.data for b, x in zip(tr.base, tr.x))
    # the Chrome export rounds to 1 ns and gives zero-length firings 1 ns
    want = sorted((e.start - t0, max(e.dur, 0.001)) for e in trace.events)
    assert all(abs(a - c) < 0.01 and abs(b - d) < 0.01 for (a, b), (c, d) in zip(drawn, want))
    by_kind = {tr.name: len(tr.x) for tr in fig.data}
    assert by_kind["communication"] == sum(e.lane == "comm" for e in trace.events)
    assert by_kind["update"] == sum(e.phase == "update" and e.lane != "comm" for e in trace.events)


def test_lane_rows_sort_naturally():
    from sbplab.viz.timeline import _rows

    ev = [{"ph": "X", "pid": 0, "tid": t, "name": "a", "ts": 0, "dur": 1} for t in ["comm 2", "comm 10", "comm 1"]]
    assert _rows(timeline_bars(ev)) == ["rank 0 · comm 1", "rank 0 · comm 2", "rank 0 · comm 10"]
