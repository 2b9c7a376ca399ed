"""The timeline draws exactly the trace's firings: one bar per event, at its time, in its rank's lane."""

from __future__ import annotations

import json
import re

import pytest

import sbplab as sl
from sbplab.errors import InputError, InputTypeError
from sbplab.runtime.trace import Trace, TraceEvent
from sbplab.viz.colors import KIND_COLORS, axis_color
from sbplab.viz.timeline import compare_timelines, event_kind, makespan_us, timeline, timeline_bars
from sbplab.viz.timeline_bars import idle_gaps, select


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


def drawn(fig) -> list[dict]:
    """Every firing bar of a figure (idle bars aside): the row its y places it in, times, slot, legend
    entry, and the actor and step its hover names."""
    out = []
    for tr in fig.data:
        if tr.meta != "firings":  # idle gaps, transfer stretches, links, critical path, counters
            continue
        for x, base, y, w, hover in zip(tr.x, tr.base, tr.y, tr.width, tr.hovertext):
            step = re.search(r"step (\d+)", hover)
            out.append({"row": lane_of(fig, float(y), tr.yaxis or "y"), "actor": hover.rsplit(" · actor ", 1)[1]
                        .split("<br>")[0], "step": int(step.group(1)) if step else None,
                        "start_ms": float(base), "dur_ms": float(x),
                        "y": float(y), "width": float(w), "series": tr.name, "color": tr.marker.color,
                        "hover": hover, "axis": tr.yaxis or "y"})
    return out


def lane_of(fig, y: float, axis: str = "y") -> str:
    """The row label whose lane holds height ``y``: lanes stack from 0 downwards, each centred on its
    tick, so each lane's bottom is twice its centre less its top."""
    ya = getattr(fig.layout, "yaxis" + axis[1:])
    top = 0.0
    for centre, label in zip(ya.tickvals, ya.ticktext):
        bottom = 2 * centre - top
        if top <= y <= bottom:
            return label
        top = bottom
    raise AssertionError(f"y={y} is in no lane of {list(ya.ticktext)}")


def test_bars_equal_trace_events_on_a_ms_axis():
    ev = pipeline_trace(stages=2, micro=3, fwd=10.0, bwd=20.0)
    fig = timeline(ev, title="gpipe")
    complete = [e for e in ev if e["ph"] == "X"]
    t0 = min(e["ts"] for e in complete)
    lanes = {0: "compute", 1: "comm"}
    got = sorted((b["row"], round(b["start_ms"], 9), round(b["dur_ms"], 9)) for b in drawn(fig))
    want = sorted((f"rank {e['pid']} · {lanes[e['tid']]}", round((e["ts"] - t0) / 1e3, 9), round(e["dur"] / 1e3, 9))
                  for e in complete)
    assert got == want
    assert fig.layout.xaxis.title.text == "time (ms)"
    # rank 0 at the top, compute above comm: the y axis runs downwards; each bar sits in its lane
    assert list(fig.layout.yaxis.ticktext) == ["rank 0 · compute", "rank 0 · comm", "rank 1 · compute"]
    assert all(lane_of(fig, b["y"] - b["width"] / 2) == lane_of(fig, b["y"] + b["width"] / 2) == b["row"]
               for b in drawn(fig))  # no bar reaches into the next lane
    assert list(fig.layout.yaxis.range)[0] > list(fig.layout.yaxis.range)[1]


def test_one_lane_per_rank_and_stream_with_overlaps_side_by_side():
    """Overlapping collectives share their rank's one comm lane, in slots that do not overlap."""
    ev = [TraceEvent(0, "compute", "fc1", "matmul", "compute", "forward", 0, 0, 0, 0.0, 10.0),
          TraceEvent(0, "comm", "ar1", "all_reduce", "collective", "backward", 0, -1, 0, 12.0, 30.0, 4096, 0, (0, 1)),
          TraceEvent(0, "comm", "ar2", "all_reduce", "collective", "backward", 0, -1, 0, 14.0, 20.0, 1024, 0, (0, 1)),
          TraceEvent(0, "comm", "ag", "all_gather", "collective", "forward", 0, -1, 0, 16.0, 18.0, 512, 1, (0, 2)),
          TraceEvent(1, "compute", "fc1", "matmul", "compute", "forward", 0, 1, 1, 2.0, 9.0),
          TraceEvent(1, "compute", "sgd", "sgd", "compute", "update", 0, -1, 0, 31.0, 33.0)]
    trace = Trace(ev)
    rows0 = {e["tid"] for e in trace.to_chrome()["traceEvents"] if e["ph"] == "X" and e["pid"] == 0}
    assert len(rows0) == 4  # the Chrome export spreads them over 3 comm rows
    bars = timeline_bars(trace)
    assert {b.row for b in bars} == {"rank 0 · compute", "rank 0 · comm", "rank 1 · compute"}
    comm = sorted((b for b in bars if b.lane == "comm"), key=lambda b: b.start_us)
    assert [(b.level, b.levels) for b in comm] == [(0, 3), (1, 3), (2, 3)]
    fig = timeline(trace)
    assert list(fig.layout.yaxis.ticktext) == ["rank 0 · compute", "rank 0 · comm", "rank 1 · compute"]
    slots = sorted((b["y"] - b["width"] / 2, b["y"] + b["width"] / 2) for b in drawn(fig) if b["row"] == "rank 0 · comm")
    assert len(slots) == 3 and all(a[1] <= b[0] for a, b in zip(slots, slots[1:]))  # no two overlap
    got = sorted((b.rank, b.name, b.kind, b.start_us, b.dur_us, b.micro_batch) for b in bars)
    want = sorted((e.rank, e.actor, "collective" if e.kind == "collective" else e.phase, e.start, e.end - e.start,
                   e.micro if e.micro >= 0 else None) for e in ev)
    assert got == want
    assert makespan_us(trace) == trace.span_us
    assert sorted(b.name for b in timeline_bars(trace.select(rank=1))) == ["fc1", "sgd"]


def test_colours_legend_and_idle():
    """Phases are shades of the compute colour, each mesh axis's collectives a hue of its own,
    transfers red, and the compute lane's gaps grey; each entry once in the legend."""
    ev = [TraceEvent(0, "compute", "f", "matmul", "compute", "forward", 0, -1, 0, 0.0, 10.0),
          TraceEvent(0, "comm", "c0", "all_reduce", "collective", "forward", 0, -1, 0, 10.0, 20.0, 64, 1, (0, 1)),
          TraceEvent(0, "compute", "g", "matmul", "compute", "backward", 0, -1, 0, 40.0, 60.0),
          TraceEvent(0, "comm", "c1", "all_reduce", "collective", "backward", 0, -1, 0, 60.0, 70.0, 64, 0, (0, 2)),
          TraceEvent(0, "comm", "s", "send", "send", "backward", 0, -1, 0, 60.0, 65.0, 32, None, (0, 3)),
          TraceEvent(0, "compute", "u", "sgd", "compute", "update", 0, -1, 0, 70.0, 72.0)]
    fig = timeline(Trace(ev))
    by = {tr.name: tr for tr in fig.data if tr.meta in ("firings", "idle")}
    assert set(by) == {"forward", "backward", "update", "collectives on mesh axis 0", "collectives on mesh axis 1",
                       "send / recv", "idle"}
    assert [tr.showlegend for tr in fig.data].count(True) == len({tr.name for tr in fig.data})
    assert by["collectives on mesh axis 0"].marker.color == axis_color(0)
    assert by["collectives on mesh axis 1"].marker.color == axis_color(1) != axis_color(0)
    assert by["send / recv"].marker.color == KIND_COLORS["p2p"]
    phases = [by[p].marker.color for p in ("forward", "backward", "update")]
    assert phases == [KIND_COLORS[p] for p in ("forward", "backward", "update")] and len(set(phases)) == 3
    # idle: the compute lane's gaps, 10 to 40 us and 60 to 70 us (the comm lane is busy then)
    idle = by["idle"]
    assert [(float(b), float(x)) for b, x in zip(idle.base, idle.x)] == [(0.010, 0.030), (0.060, 0.010)]
    assert "idle for 30.0 µs" in idle.hovertext[0]
    assert "from rank 0 to rank 3" in by["send / recv"].hovertext[0]
    assert "group (0, 2) on mesh axis 0" in by["collectives on mesh axis 0"].hovertext[0]


def test_hand_made_chrome_events_are_classified():
    ev = [
        {"ph": "B", "pid": 0, "tid": 7, "name": "all_reduce", "ts": 100, "args": {"bytes": 64}},
        {"ph": "E", "pid": 0, "tid": 7, "ts": 150},
        {"ph": "X", "pid": 1, "tid": 0, "name": "relu", "ts": 120, "dur": 4, "args": {"phase": "backward"}},
        {"ph": "X", "pid": 1, "tid": 3, "name": "send", "ts": 124, "dur": 4, "args": {"op": "send"}},
        {"ph": "i", "pid": 1, "tid": 0, "name": "mark", "ts": 130},
    ]
    bars = timeline_bars({"traceEvents": ev})
    assert [(b.row, b.kind, b.start_us, b.dur_us) for b in bars] == [
        ("rank 0 · comm", "collective", 100.0, 50.0), ("rank 1 · compute", "backward", 120.0, 4.0),
        ("rank 1 · comm", "p2p", 124.0, 4.0)]
    assert event_kind({"name": "x", "args": {"kind": "recv"}}) == "p2p"


def test_begin_end_pairs_and_chrome_json_file(tmp_path):
    ev = pipeline_trace(stages=2, micro=2, fwd=10.0, bwd=20.0)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    assert makespan_us(str(path)) == makespan_us(ev) > 0
    assert len(timeline_bars(path)) == sum(e["ph"] == "X" for e in ev)


def test_hover_reads_actor_op_module_sbp_bytes_duration():
    """With the compiled step, hovering a bar names the module and the SBPs in and out, read back from
    the physical graph; the legend names the mesh axes. The simulator's trace draws like a run's."""
    from sbplab.compiler.physical.graph import PhysNode  # noqa: F401  (the objects read below)
    from sbplab.models import MLP, MLPConfig
    from sbplab.sbp import fmt_sbp

    m = MLP(MLPConfig(n_blocks=1))
    (x,), y = m.example_batch(8)
    c = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=sl.presets.dp_tp((2, 2)))
    pred = sl.simulate(c, sl.Hardware.cpu_box())
    trace = pred.trace
    plan = c.plan()
    # the trace records each collective's mesh axis and group, as the plan's actors have them
    colls = [e for e in trace.events if e.kind == "collective"]
    assert colls and {e.mesh_axis for e in colls} == {0, 1}
    for e in colls:
        a = plan.ranks[e.rank].by_name[e.actor]
        assert (e.mesh_axis, e.group) == (a.mesh_axis, a.group)
    fig = timeline(pred, compiled=c)
    assert fig.layout.title.text.startswith("predicted on ")
    names = {tr.name for tr in fig.data}
    assert {"collectives on dp (mesh axis 0)", "collectives on tp (mesh axis 1)"} <= names
    bars = drawn(fig)
    assert len(bars) == len(trace.events)
    fc1 = next(n for n in c.physical.nodes if n.kind == "compute" and n.logical == "blocks.0.fc1" and n.rank == 0)
    (hover,) = [b["hover"] for b in bars if f"actor n{fc1.id}<" in b["hover"] and "rank 0, step 0" in b["hover"]]
    ins = ", ".join(fmt_sbp(c.physical.nodes[r.node].out_sbps[r.out]) for r in fc1.inputs)
    assert f"<b>{fc1.op}</b> · forward" in hover
    assert f"module {c.graph.op_by_name['blocks.0.fc1'].module}" in hover
    assert f"SBP {ins} -> {fmt_sbp(fc1.out_sbps[0])}" in hover
    assert "duration" in hover and "step 0" in hover
    coll = next(b for b in bars if b["series"] == "collectives on tp (mesh axis 1)")
    assert "bytes sent" in coll["hover"] and "on mesh axis 1 (tp)" in coll["hover"] and " -> " in coll["hover"]
    # a collective names the tensor it moves and its SBP before and after, read from the plan's boxing step
    rank, actor = next((e.rank, e.actor) for e in colls if e.mesh_axis == 1)
    step = c.physical.nodes[next(i for i in c.physical.collectives[int(actor[1:])].nodes
                                 if c.physical.nodes[i].rank == rank)].attrs["plan_step"]
    want = f"{fmt_sbp(step.src_sbp)} -> {fmt_sbp(step.dst_sbp)} (before -> after)"
    tips = [b["hover"] for b in bars if f"actor {actor}<" in b["hover"] and f"rank {rank}," in b["hover"]]
    assert tips and all(want in t and " of " in t.split("<br>")[0] for t in tips)
    no_info = drawn(timeline(trace))  # without the compiled step: no module, no SBP, the rest is there
    assert not any("module" in b["hover"] for b in no_info) and all("duration" in b["hover"] for b in no_info)


def test_select_a_step_keeps_what_belongs_to_it():
    """One step is its firings by step number: a prefetch that starts before the step's first kernel
    stays; input-less firings that ran far ahead (flows say so) are left out."""
    ev = [TraceEvent(0, "compute", "src", "source", "source", "forward", 1, -1, 1, 0.0, 0.1),
          TraceEvent(0, "compute", "w", "state", "state", "forward", 1, -1, 1, 40.0, 40.1),
          TraceEvent(0, "comm", "ag", "all_gather", "collective", "forward", 1, -1, 1, 45.0, 60.0, 64, 0, (0, 1)),
          TraceEvent(0, "compute", "fc", "matmul", "compute", "forward", 0, -1, 0, 50.0, 55.0),
          TraceEvent(0, "compute", "fc", "matmul", "compute", "forward", 1, -1, 1, 61.0, 70.0),
          TraceEvent(0, "comm", "ag", "all_gather", "collective", "forward", 2, -1, 2, 65.0, 80.0, 64, 0, (0, 1))]
    trace = Trace(ev, flows=[(1, 2), (2, 4), (0, 4)])
    bars = select(timeline_bars(trace), step=1)
    assert [b.name for b in bars] == ["ag", "fc"]  # the source fired ahead; the state is a holder
    assert [b.name for b in select(timeline_bars(Trace(ev)), step=1)] == ["src", "w", "ag", "fc"]  # no flows
    fig = timeline(trace, step=1)
    assert sorted(b["start_ms"] for b in drawn(fig)) == [0.0, pytest.approx(0.016)]
    with pytest.raises(InputError, match=r"no firings of step 5; the trace has steps \[0, 1, 2\]"):
        timeline(trace, step=5)
    with pytest.raises(InputError, match=r"no firings on ranks \[3\]"):
        timeline(trace, ranks=[3])
    with pytest.raises(InputTypeError, match="pass the title as title='x'"):
        timeline(trace, "x")
    assert idle_gaps([]) == []


def test_compare_two_strategies_on_one_time_scale():
    a = pipeline_trace(stages=2, micro=4, fwd=10.0, bwd=20.0)
    b = pipeline_trace(stages=2, micro=2, fwd=20.0, bwd=40.0, t0=5.0)
    fig = compare_timelines({"traceEvents": a}, b, labels=("4 micro", "2 micro"))
    per_axis: dict[str, int] = {}
    for bar in drawn(fig):
        per_axis[bar["axis"]] = per_axis.get(bar["axis"], 0) + 1
    assert per_axis == {"y": sum(e["ph"] == "X" for e in a), "y2": sum(e["ph"] == "X" for e in b)}
    assert fig.layout.xaxis2.matches == "x"  # shared time scale
    titles = [x.text for x in fig.layout.annotations]
    assert titles == [f"4 micro: {makespan_us(a):.1f} µs", f"2 micro: {makespan_us(b):.1f} µs"]
    assert makespan_us(a) < makespan_us(b)  # more micro-batches fill the pipeline bubble
    legends = [tr.name for tr in fig.data if tr.showlegend]
    assert sorted(legends) == sorted({tr.name for tr in fig.data})  # each entry once in the legend
    side = timeline(a, b, arrange="side")  # sl.timeline(a, b) is the same picture
    assert side.layout.xaxis2.domain[0] > side.layout.xaxis.domain[1]
    with pytest.raises(InputError, match="arrange must be"):
        compare_timelines([], [], arrange="grid")


def test_bad_events_are_named():
    with pytest.raises(ValueError, match="event 0 .*'f'.* has no 'ts'"):
        timeline_bars([{"ph": "X", "name": "f", "dur": 1}])
    with pytest.raises(ValueError, match="complete event 0 .* has no 'dur'"):
        timeline_bars([{"ph": "X", "name": "f", "ts": 1}])
    with pytest.raises(ValueError, match="no matching begin"):
        timeline_bars([{"ph": "E", "pid": 0, "tid": 0, "ts": 1}])
    with pytest.raises(TypeError, match="trace event 0 is a int"):
        timeline_bars([3])


@pytest.fixture(scope="module")
def zero3_run():
    """A compiled ZeRO-3 MLP, run for 3 steps on 2 worker processes."""
    from sbplab.models import MLP, MLPConfig

    m = MLP(MLPConfig(in_dim=16, width=32, hidden=64, n_blocks=2, n_classes=8))
    (x,), y = m.example_batch(8)
    c = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=sl.presets.zero(2))
    with sl.LocalCluster(2) as cluster:
        return c, cluster.run(c, (x, y), steps=3, progress=False)


@pytest.mark.multiprocess
def test_zero3_step_shows_its_prefetched_all_gathers(zero3_run):
    from sbplab.boxing.kinds import kind_of
    from sbplab.sbp import B, S

    c, res = zero3_run
    step = 2
    events = [e for e in res.trace.events if e.step == step]
    first_kernel = min(e.start for e in events if e.phase == "forward" and e.kind == "compute" and e.op != "fill")
    gathers = [e for e in events if e.kind == "collective" and kind_of(e.op).turns(S(0), B)]
    assert gathers and any(e.start < first_kernel for e in gathers)  # prefetched: a time window would lose them
    fig = timeline(res, step=step, compiled=c)
    bars = drawn(fig)
    comm = [b for b in bars if b["row"].endswith("comm")]
    want = [e for e in events if e.lane == "comm"]
    assert len(comm) == len(want)  # every collective of the step, prefetched or not, and no other step's
    t0 = min(e.start for e in events if e.kind == "collective")
    starts = sorted(b["start_ms"] for b in comm)  # the figure keeps milliseconds to 10 ns
    assert starts == pytest.approx(sorted((e.start - t0) / 1e3 for e in want), abs=1e-5)
    assert {b["series"] for b in comm} == {"collectives on mesh axis 0"}
    assert all("step 2" in b["hover"] for b in bars)
    ag = [b for b in comm if b["hover"].startswith(f"<b>{gathers[0].op}</b>")]
    assert len(ag) == len(gathers) and all("-> (B)" in b["hover"] for b in ag)  # S(0) -> B: gathered for use


@pytest.mark.multiprocess
def test_measured_memory_over_time_is_a_track_per_rank(zero3_run):
    """Each rank's bytes held, sampled at every register stored or freed, on the trace's clock: its
    highest sample is the measured peak, it starts with the run and ends by the time the run did."""
    c, res = zero3_run
    series = res.trace.memory_series(res.memory)
    assert sorted(series) == [0, 1]
    for r, s in series.items():
        times = [t for t, _ in s]
        first = min(e.start for e in res.trace.select(rank=r))
        assert times == sorted(times) and len(s) > len(res.trace.select(rank=r)) // 2
        assert -2e3 < times[0] <= first and times[-1] < res.wall_s * 1e6 + 2e3  # the run's time, clocks aligned
        assert max(v for _, v in s) == res.memory[r].peak  # CPU: the peak is the series' highest value
        assert len({v for _, v in s}) > 3  # it moves: activations come and go
    tracks = [tr for tr in timeline(res, compiled=c).data if tr.meta == "counters"]
    assert [tr.name for tr in tracks] == ["memory, rank 0", "memory, rank 1"]
    assert [max(tr.y) for tr in tracks] == [res.memory[0].peak, res.memory[1].peak]
    step1 = [tr for tr in timeline(res, step=1).data if tr.meta == "counters"]
    assert step1 and all(len(a.x) < len(b.x) for a, b in zip(step1, tracks)) and min(step1[0].x) >= 0
    chrome = res.trace.to_chrome(memory=res.memory)["traceEvents"]  # Perfetto draws the same counters
    assert sum(e["ph"] == "C" and e["pid"] == 0 for e in chrome) == len(series[0])


@pytest.mark.multiprocess
def test_prediction_over_measured_run(zero3_run):
    c, res = zero3_run
    pred = sl.simulate(c, sl.Hardware.cpu_box(), steps=3)
    fig = sl.timeline(pred, res, step=1, compiled=c)
    titles = [a.text for a in fig.layout.annotations]
    assert titles[0].startswith("predicted on ") and titles[1].startswith("measured: ")
    assert fig.layout.xaxis2.matches == "x"
    per_axis: dict[str, int] = {}
    for bar in drawn(fig):
        per_axis[bar["axis"]] = per_axis.get(bar["axis"], 0) + 1
    assert per_axis == {"y": len(select(timeline_bars(pred.trace), 1)), "y2": len(select(timeline_bars(res.trace), 1))}
    # the same actors on both sides: predicted and measured line up actor by actor
    names = [{(b["row"], b["actor"]) for b in drawn(fig) if b["axis"] == ax and "comm" in b["row"]} for ax in ("y", "y2")]
    assert names[0] == names[1] and names[0]


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
    bars = drawn(fig)
    assert len(bars) == len(trace.events)
    t0 = min(e.start for e in trace.events)
    got = sorted((b["start_ms"], b["dur_ms"]) for b in bars)
    # the Chrome export rounds to 1 ns and gives zero-length firings 1 ns
    want = sorted(((e.start - t0) / 1e3, max(e.dur, 0.001) / 1e3) for e in trace.events)
    assert all(abs(a - c) < 1e-5 and abs(b - d) < 1e-5 for (a, b), (c, d) in zip(got, want))
    series = {}
    for b in bars:
        series[b["series"]] = series.get(b["series"], 0) + 1
    assert series["send / recv"] == sum(e.kind in ("send", "recv") for e in trace.events) > 0
    assert series["update"] == sum(e.phase == "update" and e.lane != "comm" for e in trace.events)
    assert {b["row"] for b in bars} == {"rank 0 · compute", "rank 0 · comm", "rank 1 · compute", "rank 1 · comm"}
