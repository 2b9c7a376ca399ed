"""What a Perfetto user looks for beside the bars: waiting apart from transferring, a collective's members
and a send and its receive joined, step markers, the critical path, memory counters."""

from __future__ import annotations

import pytest

import sbplab as sl
from sbplab.fmt import fmt_bytes
from sbplab.runtime.trace import Trace, TraceEvent
from sbplab.viz.timeline import fmt_us, timeline, timeline_bars
from sbplab.viz.timeline_bars import select
from sbplab.viz.timeline_links import collective_instances, p2p_pairs, step_starts, transfer_starts


def traces(fig, meta: str) -> list:
    return [tr for tr in fig.data if tr.meta == meta]


def two_rank_trace() -> Trace:
    """Rank 1 posts the all-reduce 20 us after rank 0; rank 0 then sends to rank 1, which posted its
    receive early; each rank's forward kernel opens step 0."""
    ev = [TraceEvent(0, "compute", "f", "matmul", "compute", "forward", 0, -1, 0, 0.0, 10.0),
          TraceEvent(1, "compute", "f", "matmul", "compute", "forward", 0, -1, 0, 5.0, 30.0),
          TraceEvent(0, "comm", "c0", "all_reduce", "collective", "backward", 0, -1, 0, 10.0, 50.0, 64, 0, (0, 1)),
          TraceEvent(1, "comm", "c0", "all_reduce", "collective", "backward", 0, -1, 0, 30.0, 50.0, 64, 0, (0, 1)),
          TraceEvent(0, "comm", "c1", "all_reduce", "collective", "backward", 0, -1, 0, 12.0, 70.0, 64, 0, (0, 1)),
          TraceEvent(1, "comm", "c1", "all_reduce", "collective", "backward", 0, -1, 0, 31.0, 70.0, 64, 0, (0, 1)),
          TraceEvent(1, "comm", "r", "recv", "recv", "forward", 0, -1, 0, 52.0, 95.0, 0, None, (0, 1)),
          TraceEvent(0, "comm", "s", "send", "send", "forward", 0, -1, 0, 80.0, 90.0, 32, None, (0, 1)),
          TraceEvent(0, "compute", "f", "matmul", "compute", "forward", 1, -1, 1, 100.0, 110.0)]
    return Trace(ev, flows=[(7, 6)])  # the send feeds the receive


def test_waiting_is_drawn_apart_from_transferring():
    bars = timeline_bars(two_rank_trace())
    by = {(b.rank, b.name): i for i, b in enumerate(bars)}
    ready = transfer_starts(bars)
    # the all-reduce moves data once rank 1 has posted it (30 us), on both ranks
    assert ready[by[0, "c0"]] == ready[by[1, "c0"]] == 30.0
    # c1, posted right after c0, waits for its stream: it moves once c0 is done (50 us)
    assert ready[by[0, "c1"]] == ready[by[1, "c1"]] == 50.0
    # the receive posted at 52 us moves once its send has started (80 us); compute never waits
    assert ready[by[1, "r"]] == 80.0 and ready[by[0, "f"]] == bars[by[0, "f"]].start_us
    assert [tuple(bars[i].name for i in ix) for ix in collective_instances(bars)] == [("c0", "c0"), ("c1", "c1")]
    assert [(bars[s].name, bars[r].name) for s, r in p2p_pairs(bars)] == [("s", "r")]

    fig = timeline(two_rank_trace())
    moved = {(float(b), float(x)) for tr in traces(fig, "transfers") for b, x in zip(tr.base, tr.x)}
    assert (0.030, 0.020) in moved and (0.080, 0.015) in moved  # c0 from 30 us, the receive from 80 us
    firing = {tr.name: tr for tr in traces(fig, "firings")}
    shapes = dict(zip([h.split("<br>")[-2] for h in firing["send / recv"].hovertext],
                      firing["send / recv"].marker.pattern.shape))
    assert shapes["rank 1, step 0 · actor r"] == "/" and shapes["rank 0, step 0 · actor s"] == ""
    assert any("waited 28.0 µs" in h for h in firing["send / recv"].hovertext)
    assert any(tr.name.startswith("waiting (hatched)") and tr.showlegend for tr in fig.data)


def test_links_join_collective_members_and_send_to_recv():
    fig = timeline(two_rank_trace())
    lanes = dict(zip(fig.layout.yaxis.ticktext, fig.layout.yaxis.tickvals))
    (members,) = [tr for tr in traces(fig, "links") if tr.name == "collective members"]
    pts = [(x, y) for x, y in zip(members.x, members.y) if x is not None]
    assert [round(x, 6) for x, _ in pts] == [0.03, 0.03, 0.05, 0.05]  # at the moment data starts to move
    (coll,) = [tr for tr in traces(fig, "firings") if tr.name.startswith("collectives")]
    assert {round(y, 6) for _, y in pts} == {round(y, 6) for y in coll.y}  # through each member's own bar
    assert {round(y) for y in coll.y} != {round(lanes["rank 0 · comm"])}  # on both ranks' lanes
    (arrow,) = [tr for tr in traces(fig, "links") if tr.name == "send → recv"]
    assert [x for x in arrow.x if x is not None] == [pytest.approx(0.080), pytest.approx(0.095)]  # send start, recv end
    assert list(arrow.marker.symbol[:2]) == ["circle", "arrow"]


def test_step_markers_at_each_steps_first_forward_kernel():
    bars = timeline_bars(two_rank_trace())
    assert step_starts(bars) == {0: 0.0, 1: 100.0}
    fig = timeline(two_rank_trace())
    marks = sorted((float(s.x0), a.text) for s, a in zip([s for s in fig.layout.shapes if s.line.dash == "dash"],
                                                         fig.layout.annotations))
    assert marks == [(0.0, "step 0"), (0.1, "step 1")]
    # the labels sit in a band above the top lane (the y axis runs downwards): over no bar, and in
    # the plot, not in the margin a subplot's title uses
    lo, hi = fig.layout.yaxis.range
    bar_tops = [y - w / 2 for tr in traces(fig, "firings") for y, w in zip(tr.y, tr.width)]
    for a in fig.layout.annotations:
        assert a.yref in (None, "y") and hi <= a.y < 0 <= min(bar_tops), (a.y, hi, min(bar_tops))
        assert a.y - 0.2 > hi and a.y + 0.2 < min(bar_tops)  # a 10 px label (< 0.4 lane) fits around y
    assert lo > max(y + w / 2 for tr in traces(fig, "firings") for y, w in zip(tr.y, tr.width))


def test_critical_path_of_a_prediction_is_outlined():
    from sbplab.models import MLP, MLPConfig

    m = MLP(MLPConfig(n_blocks=2))
    (x,), y = m.example_batch(16)
    st = sl.presets.pipeline(stages=2, micro_batches=2, stage_of={"blocks.0": 0, "blocks.1": 1})
    c = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=st)
    pred = sl.simulate(c, sl.Hardware.cpu_box())
    fig = timeline(pred, compiled=c)
    (crit,) = traces(fig, "critical")
    path = pred.critical_path
    assert path and len(crit.x) == len({(e.rank, e.actor, e.firing) for e in path})
    t0 = min(b.start_us for b in timeline_bars(pred))
    ends = sorted(round(float(b) + float(x), 4) for b, x in zip(crit.base, crit.x))
    assert ends[-1] == round((max(e.end for e in path) - t0) / 1e3, 4)  # it ends where the last step does
    assert traces(fig, "links") and any(tr.name == "send → recv" for tr in traces(fig, "links"))
    assert not traces(timeline(pred.trace), "critical")  # a bare trace has no critical path to show
    ticks = list(fig.layout.yaxis.ticktext)  # the simulated peak memory beside each rank's compute lane
    assert ticks[0] == f"rank 0 · compute (peak {fmt_bytes(pred.peak_memory[0])})"
    assert "peak" not in "".join(timeline(pred.trace).layout.yaxis.ticktext)


def test_memory_counters_draw_a_track_per_rank():
    chrome = two_rank_trace().to_chrome()
    samples = {0: [(0.0, 1000), (10.0, 3000), (60.0, 2000)], 1: [(5.0, 500), (40.0, 4500)]}
    for r, pts in samples.items():
        chrome["traceEvents"] += [{"ph": "C", "pid": r, "name": "memory", "ts": t, "args": {"bytes": v}}
                                  for t, v in pts]
    fig = timeline(chrome)
    tracks = traces(fig, "counters")
    assert [(tr.name, list(tr.y)) for tr in tracks] == [("memory, rank 0", [1000, 3000, 2000]),
                                                        ("memory, rank 1", [500, 4500])]
    assert all(tr.line.shape == "hv" and tr.yaxis == "y2" for tr in tracks)
    assert fig.layout.yaxis2.title.text == "memory (bytes)"
    given = timeline(two_rank_trace(), memory={0: [(0.0, 7), (50.0, 9)]})
    assert [list(tr.y) for tr in traces(given, "counters")] == [[7, 9]]
    assert not traces(timeline(two_rank_trace()), "counters")  # nothing measured, no track


def test_zero3_step_by_number_keeps_its_prefetched_all_gathers():
    """A step's all-gathers prefetched while the step before still computes belong to it by number."""
    from sbplab.models import MLP, MLPConfig

    m = MLP(MLPConfig(n_blocks=2))
    (x,), y = m.example_batch(16)
    c = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.Adam(lr=0.01), strategy=sl.presets.zero(4))
    pred = sl.simulate(c, sl.Hardware.cpu_box())
    gathers = [e for e in pred.trace.events if e.step == 2 and e.op == "all_gather"]
    first = min(e.start for e in pred.trace.events if e.step == 2 and e.phase == "forward" and e.kind == "compute"
                and e.op not in ("fill", "source"))
    assert gathers and any(e.start < first for e in gathers)
    kept = [b for b in select(timeline_bars(pred), step=2) if b.args.get("op") == "all_gather"]
    assert len(kept) == len(gathers)


def test_rounding_residues_read_as_zero():
    assert fmt_us(1.73e-12) == "0 µs" and fmt_us(850.0) == "850.0 µs" and fmt_us(12_300.0) == "12.3 ms"
