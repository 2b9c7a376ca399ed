"""The execution simulator: exact times on hand-built plans with known kernel costs, the firing rule in
the predicted trace, the same firings as a real run, peak memory by hand, core contention, bad input."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

import sbplab as sl
from sbplab.hardware import Hardware, op_key
from sbplab.placement import Placement
from sbplab.runtime import ActorPlan, Collective, Compute, Recv, Ref, Send, Sink, Source, State
from sbplab.runtime.examples import data_parallel_linear
from sbplab.runtime.firing import FiringGraph
from sbplab.sbp import B, P
from sbplab.sim import SimulationError, simulate

K = "sbplab.runtime.kernels:"
MS = 1e-3


def exact_hw(op_times: dict, cores: int | None = None) -> Hardware:
    """Every listed op takes exactly its seconds; everything else (communication, hand-overs) ~0."""
    return Hardware(name="exact", axis_bandwidth=(1e30,), axis_latency=(0.0,), p2p_bandwidth=1e30,
                    p2p_latency=0.0, flops=1e30, mem_bandwidth=1e30, cores=cores,
                    op_times=tuple(op_times.items()))


def two_stage_pipeline(M: int, mb: int = 2, registers: int = 2) -> ActorPlan:
    """Stage 0: x @ w0 -> send; stage 1: @ w1, MSE loss, backward; gradients come back by recv.

    Stage 1 computes its weight gradient before the input gradient (declaration order breaks the
    tie), so the gradient goes back at the end of its backward, as the textbook schedule draws it."""
    pl0, pl1 = Placement("cpu", [0]), Placement("cpu", [1])
    R = registers
    s0 = [Source("x", feed="x", placement=pl0, sbp=(B,), registers=R),  # (mb, 4)
          State("w0", init=torch.randn(4, 4), update=Ref("sgd"), key="w0", placement=pl0, sbp=(B,)),
          Compute("h", op=K + "matmul", inputs=("x", "w0"), registers=R),  # (mb, 4)
          Send("h_out", inputs=("h",), peer=1, tag=0, registers=R),
          Recv("g_in", peer=1, tag=1, shape=(mb, 4), phase="backward", registers=R),
          Compute("dw", op=K + "matmul_tn", inputs=("x", "g_in"), phase="backward", registers=R),
          sl.runtime.Accumulate("acc", inputs=("dw",), phase="backward", registers=1),
          Compute("sgd", op=K + "sgd", inputs=("w0", "acc"), scope="step", phase="update",
                  attrs={"lr": 0.1}, registers=1)]
    s1 = [Recv("h_in", peer=0, tag=0, shape=(mb, 4), registers=R),
          State("w1", init=torch.randn(4, 3), update=Ref("sgd"), key="w1", placement=pl1, sbp=(B,)),
          Compute("y", op=K + "matmul", inputs=("h_in", "w1"), registers=R),  # (mb, 3)
          Source("t", feed="t", placement=pl1, sbp=(B,), registers=R),
          Compute("loss", op=K + "mse_loss", inputs=("y", "t"), outputs=2, attrs={"norm": mb * 3},
                  registers=R),
          Sink("loss_out", inputs=("loss",), key="loss", placement=pl1, sbp=(B,)),
          Compute("dw", op=K + "matmul_tn", inputs=("h_in", Ref("loss", 1)), phase="backward", registers=R),
          Compute("dx", op=K + "matmul_nt", inputs=(Ref("loss", 1), "w1"), phase="backward", registers=R),
          Send("g_out", inputs=("dx",), peer=0, tag=1, phase="backward", registers=R),
          sl.runtime.Accumulate("acc", inputs=("dw",), phase="backward", registers=1),
          Compute("sgd", op=K + "sgd", inputs=("w1", "acc"), scope="step", phase="update",
                  attrs={"lr": 0.1}, registers=1)]
    return ActorPlan.build(2, {0: s0, 1: s1}, micro_batches=M, name="two-stage")


def pipeline_costs(mb: int, F: float, Bw: float) -> dict:
    """Forward F and backward Bw per micro-batch on each stage; the update costs nothing."""
    def key(op, *shapes):
        return op_key(K + op, shapes, torch.float32, "cpu")
    return {key("matmul", (mb, 4), (4, 4)): F, key("matmul_tn", (mb, 4), (mb, 4)): Bw,
            key("matmul", (mb, 4), (4, 3)): F / 2, key("mse_loss", (mb, 3), (mb, 3)): F / 2,
            key("matmul_nt", (mb, 3), (4, 3)): Bw / 2, key("matmul_tn", (mb, 4), (mb, 3)): Bw / 2,
            key("sgd", (4, 4), (4, 4)): 0.0, key("sgd", (4, 3), (4, 3)): 0.0}


@pytest.mark.parametrize("M", [2, 4, 8])
def test_two_stage_pipeline_step_time_is_the_bubble_formula(M):
    S, F, Bw, mb = 2, 1 * MS, 2 * MS, 2
    plan = two_stage_pipeline(M, mb)
    feeds = {"x": (M * mb, 4), "t": (M * mb, 3)}
    pred = simulate(plan, exact_hw(pipeline_costs(mb, F, Bw)), steps=3, feeds=feeds)
    # (M + S - 1) slots of F + B per step; each stage is idle (S - 1) of them: the bubble
    assert pred.step_time == pytest.approx((M + S - 1) * (F + Bw), rel=1e-9)
    for r in (0, 1):
        b = pred.breakdown[r]
        assert b["compute"] == pytest.approx(M * (F + Bw), rel=1e-9)
        assert b["idle"] / pred.step_time == pytest.approx((S - 1) / (M + S - 1), rel=1e-6)
        assert b["exposed communication"] == pytest.approx(0.0, abs=1e-12)
    assert pred.measured_fraction == pytest.approx(1.0)
    # the critical path ends with the last firing and only ever steps back in time
    path = pred.critical_path
    assert path[-1].end == pytest.approx(pred.step_ends[-1] * 1e6)
    assert all(a.end <= b.start + 1e-6 for a, b in zip(path, path[1:]))


def _release_times(plan: ActorPlan, trace, steps: int) -> dict:
    """(rank, actor, output number) -> when its last consumer finished (flows say who read what)."""
    out: dict = {}
    for a_i, b_i in trace.flows:
        a, b = trace.events[a_i], trace.events[b_i]
        if a.rank != b.rank:
            continue
        g = FiringGraph(plan.ranks[a.rank].actors, plan.micro_batches, steps)
        o = g.out_number(g.nodes[g.names[a.actor]], a.firing)
        key = (a.rank, a.actor, o)
        out[key] = max(out.get(key, 0.0), b.end)
    return out


@pytest.mark.parametrize("registers", [1, 2])
def test_predicted_trace_obeys_the_firing_rule(registers):
    M, mb = 4, 2
    plan = two_stage_pipeline(M, mb, registers=registers)
    pred = simulate(plan, sl.Hardware.cpu_box(), steps=2, feeds={"x": (M * mb, 4), "t": (M * mb, 3)})
    tr = pred.trace
    assert tr.flows
    for a_i, b_i in tr.flows:  # nothing fires before the registers it reads exist (a recv is posted early)
        a, b = tr.events[a_i], tr.events[b_i]
        assert a.end <= (b.start if a.rank == b.rank else b.end) + 1e-9
    released = _release_times(plan, tr, 2)
    regs = {(r, a.name): a.registers for r, rp in plan.ranks.items() for a in rp.actors}
    for e in tr.events:  # firing k waits until output k - registers has been released
        g = FiringGraph(plan.ranks[e.rank].actors, M, 2)
        o = g.register_number(g.nodes[g.names[e.actor]], e.firing)
        R = regs[(e.rank, e.actor)]
        if o is not None and o >= R and (e.rank, e.actor, o - R) in released:
            assert released[(e.rank, e.actor, o - R)] <= e.start + 1e-9


def test_peak_memory_of_a_dp_step_by_hand():
    """One linear layer, SGD with momentum, 2 data-parallel ranks, registers of one.

    Peak is while the update runs: the old and the new weight (parameters), the old and the new
    momentum (optimizer state), the all-reduced gradient, and next step's batch shard, which the
    sources have already handed out (x and t)."""
    n, b, k, m = 2, 4, 8, 4
    pl = Placement("cpu", list(range(n)))
    ranks = {}
    for r in range(n):
        ranks[r] = [
            Source("x", feed="x", placement=pl, sbp=(sl.S(0),), registers=1, scope="step"),
            Source("t", feed="t", placement=pl, sbp=(sl.S(0),), registers=1, scope="step"),
            State("w", init=torch.zeros(k, m), update=Ref("upd", 0), key="w", placement=pl, sbp=(B,)),
            State("buf", init=torch.zeros(k, m), update=Ref("upd", 1), key="buf", placement=pl, sbp=(B,)),
            Compute("fwd", op=K + "matmul", inputs=("x", "w"), registers=1, scope="step"),
            Compute("loss", op=K + "mse_loss", inputs=("fwd", "t"), outputs=2, registers=1, scope="step"),
            Sink("loss_out", inputs=("loss",), key="loss", placement=pl, sbp=(P,), scope="step"),
            Compute("dw", op=K + "matmul_tn", inputs=("x", Ref("loss", 1)), phase="backward", registers=1,
                    scope="step"),
            Collective("ar", kind_="all_reduce", group=tuple(range(n)), inputs=("dw",), phase="backward",
                       registers=1, scope="step"),
            Compute("upd", op=K + "sgd_momentum", inputs=("w", "ar", "buf"), outputs=2, phase="update",
                    attrs={"lr": 0.1, "momentum": 0.9}, registers=1, scope="step"),
        ]
    plan = ActorPlan.build(n, ranks, name="dp-momentum")
    pred = simulate(plan, sl.Hardware.cpu_box(), steps=2, feeds={"x": (b, k), "t": (b, m)})
    Pb = k * m * 4
    want = {"parameters": 2 * Pb, "optimizer state": 2 * Pb, "gradients": Pb,
            "activations": (b // n) * (k + m) * 4}
    for r in range(n):
        assert pred.memory_breakdown[r] == want
        assert pred.peak_memory[r] == sum(want.values())


def test_four_ranks_on_two_cores_take_twice_as_long():
    ranks = {}
    for r in range(4):
        ranks[r] = [State("w", init=torch.zeros(8), update=Ref("upd")),
                    Compute("f", op=K + "relu", inputs=("w",), registers=1, scope="step"),
                    Compute("upd", op=K + "add", inputs=("w", "f"), scope="step", phase="update", registers=1)]
    plan = ActorPlan.build(4, ranks, name="independent")
    times = {op_key(K + "relu", [(8,)], torch.float32, "cpu"): 1 * MS,
             op_key(K + "add", [(8,), (8,)], torch.float32, "cpu"): 3 * MS}
    alone = simulate(plan, exact_hw(times), steps=3)
    shared = simulate(plan, exact_hw(times, cores=2), steps=3)
    enough = simulate(plan, exact_hw(times, cores=4), steps=3)
    assert alone.step_time == pytest.approx(4 * MS, rel=1e-9)
    assert shared.step_time == pytest.approx(2 * alone.step_time, rel=1e-9)
    assert enough.step_time == pytest.approx(alone.step_time, rel=1e-9)


def _transfer_ms(pred, actor: str) -> float:
    f, plan = pred.firings, pred.plan
    spans = {f.end[i] - f.xfer[i] for i in range(len(f)) if plan.ranks[f.rank[i]].actors[f.node[i]].name == actor}
    assert len(spans) == 1, spans
    return spans.pop() / MS


@pytest.mark.parametrize("cores, compute_ms, want_ms", [
    (None, 10.0, 2.0),  # a GPU-like rank per device: never waits for a core
    (2, 0.0, 2.0),  # cores idle while it runs: its quiet time
    (2, 10.0, 6.0),  # both ranks compute on both cores all along: alpha becomes busy_alpha on its 2 rounds
    (2, 3.0, 3.0),  # the cores come free at 3 ms, past its quiet end (2 ms): it ends then
    (4, 10.0, 2.0),  # two of four cores compute: its threads find a free core
])
def test_a_transfer_that_starts_while_every_core_computes_waits_for_one(cores, compute_ms, want_ms):
    """Two ranks all-reduce their weights (a 2-rank ring: 2 rounds of alpha) while, or while not, each
    computes beside it; the fit says a round takes 1 ms on idle cores and 3 ms on busy ones."""
    ranks = {}
    for r in range(2):
        work = [Compute("f", op=K + "relu", inputs=("w",), registers=1, scope="step")] if compute_ms else []
        ranks[r] = [State("w", init=torch.zeros(8), update=Ref("upd")),
                    Collective("ar", kind_="all_reduce", group=(0, 1), inputs=("w",), scope="step", registers=1),
                    *work,
                    Compute("upd", op=K + "add", inputs=("w", "ar"), scope="step", phase="update", registers=1)]
    plan = ActorPlan.build(2, ranks, name="reduce-beside-compute")
    times = {op_key(K + "relu", [(8,)], torch.float32, "cpu"): compute_ms * MS}
    fit = sl.hardware.CommFit("all_reduce", 0, 2, alpha=1 * MS, bandwidth=1e30, busy_alpha=3 * MS)
    hw = exact_hw(times, cores=cores).with_measurements(origin="test", comm_fits=[fit])
    if cores is None:
        hw = dataclasses.replace(hw, cores=None)
    assert _transfer_ms(simulate(plan, hw, steps=2), "ar") == pytest.approx(want_ms, rel=1e-9)


@pytest.mark.parametrize("cores, want_ms", [
    (None, 4.0),  # quiet all along: 2 ms each, one after the other
    (2, 5.0),  # the first waits for a core until 3 ms; the second, queued behind it, starts then, quiet
])
def test_a_transfer_queued_behind_a_slowed_one_starts_when_the_cores_free(cores, want_ms):
    """Two all-reduces become possible together while both ranks compute for 3 ms on 2 cores: 2 ms each
    when quiet, 6 ms when busy. The second waits on its lane for the first; once the cores free at
    3 ms the first ends, and the second runs quiet from there, instead of after the first's slowed end
    (which would make the step 8 ms)."""
    ranks = {}
    for r in range(2):
        ranks[r] = [State("w", init=torch.zeros(8), update=Ref("upd")),
                    Collective("ar1", kind_="all_reduce", group=(0, 1), inputs=("w",), scope="step", registers=1),
                    Collective("ar2", kind_="all_reduce", group=(0, 1), inputs=("w",), scope="step", registers=1),
                    Compute("f", op=K + "relu", inputs=("w",), registers=1, scope="step"),
                    Compute("upd", op=K + "add", inputs=("w", "ar1", "ar2"), scope="step", phase="update",
                            registers=1)]
    plan = ActorPlan.build(2, ranks, name="two-reduces-beside-compute")
    times = {op_key(K + "relu", [(8,)], torch.float32, "cpu"): 3 * MS}
    fit = sl.hardware.CommFit("all_reduce", 0, 2, alpha=1 * MS, bandwidth=1e30, busy_alpha=3 * MS)
    hw = exact_hw(times, cores=cores).with_measurements(origin="test", comm_fits=[fit])
    if cores is None:
        hw = dataclasses.replace(hw, cores=None)
    pred = simulate(plan, hw, steps=3)
    assert pred.step_time == pytest.approx(want_ms * MS, rel=1e-9)
    assert _transfer_ms(pred, "ar2") == pytest.approx(2.0, rel=1e-9)  # it ran at its quiet speed


def test_ranks_alike_are_simulated_once_with_the_same_result():
    w0 = torch.randn(8, 4)
    plan = data_parallel_linear(4, w0, lr=0.1, batch=16, micro_batches=2)
    pred = simulate(plan, sl.Hardware.cpu_box(), feeds={"x": (16, 8), "t": (16, 4)})
    assert pred.classes == {0: [0, 1, 2, 3]}
    tr = pred.trace
    per_rank = Counter(e.rank for e in tr.events)
    assert len(set(per_rank.values())) == 1 and set(per_rank) == {0, 1, 2, 3}
    assert len({round(pred.breakdown[r]["idle"], 12) for r in range(4)}) == 1


def test_compiled_step_simulates_with_its_own_batch_shapes():
    model = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    (x,), y = model.example_batch(8)
    c = sl.compile(model, (x,), loss_fn=torch.nn.functional.cross_entropy, target=y,
                   optimizer=sl.SGD(lr=0.1, momentum=0.9), strategy=sl.presets.data_parallel(2, micro_batches=2))
    pred = sl.simulate(c, sl.Hardware.cpu_box())
    params = sum(p.numel() * 4 for p in model.parameters())
    for r in range(2):
        mem = pred.memory_breakdown[r]
        # every parameter and its momentum buffer held for good, plus new values being computed at the peak
        assert params <= mem["parameters"] <= 2 * params
        assert params <= mem["optimizer state"] <= 2 * params
        assert pred.peak_memory[r] == sum(mem.values())
        assert sum(pred.breakdown[r].values()) == pytest.approx(pred.step_time, rel=1e-6)
    names = {(e.rank, e.actor) for e in pred.trace.events}
    assert names == {(r, a.name) for r, rp in pred.plan.ranks.items() for a in rp.actors}
    assert pred.trace.to_chrome()["traceEvents"]


def test_bad_input_names_what_is_wrong():
    plan = two_stage_pipeline(2)
    hw = sl.Hardware.cpu_box()
    with pytest.raises(SimulationError, match="Compiled step .* or an ActorPlan"):
        simulate("plan", hw)
    with pytest.raises(SimulationError, match="needs a Machine or Hardware"):
        simulate(plan, "cpu", feeds={"x": (4, 4), "t": (4, 3)})
    with pytest.raises(SimulationError, match="steps must be an int >= 1"):
        simulate(plan, hw, steps=0, feeds={"x": (4, 4), "t": (4, 3)})
    with pytest.raises(SimulationError, match="source 'x' on rank 0 reads feed 'x'"):
        simulate(plan, hw)
    with pytest.raises(SimulationError, match="cannot be cut into 2 micro-batches"):
        simulate(plan, hw, feeds={"x": (1, 4), "t": (4, 3)})
    bad = ActorPlan.build(1, {0: [State("w", init=torch.zeros(2)),
                                   Compute("f", op="no_such_module:f", inputs=("w",))]})
    with pytest.raises(SimulationError, match="compute actor 'f': op 'no_such_module:f'"):
        simulate(bad, hw)
    shape_err = ActorPlan.build(1, {0: [State("w", init=torch.zeros(2, 3)),
                                         Compute("f", op=K + "matmul", inputs=("w", "w"))]})
    with pytest.raises(SimulationError, match=r"compute actor 'f' \(.*matmul\): cannot tell its output shapes"):
        simulate(shape_err, hw)


def test_a_mesh_with_more_axes_than_the_hardware_uses_its_last_link():
    hw = Hardware(name="one axis", axis_bandwidth=(1e9,), axis_latency=(1e-6,), p2p_bandwidth=1e9,
                  p2p_latency=1e-6, flops=1e12, mem_bandwidth=1e11)
    model = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
    (x,), y = model.example_batch(8)
    c = sl.compile(model, (x,), loss_fn=torch.nn.functional.cross_entropy, target=y,
                   strategy=sl.presets.dp_tp((2, 2)))
    pred = sl.simulate(c, hw)
    assert pred.step_time > 0
    assert any(e.lane == "comm" and e.dur > 0 for e in pred.trace.events)


@pytest.mark.multiprocess
def test_predicted_trace_has_the_firings_of_a_real_run():
    M, mb, steps = 4, 2, 2
    plan = two_stage_pipeline(M, mb)
    torch.manual_seed(0)
    batch = {"x": torch.randn(M * mb, 4), "t": torch.randn(M * mb, 3)}
    pred = simulate(plan, sl.Hardware.cpu_box(), steps=steps, feeds=batch)
    with sl.LocalCluster(2) as cluster:
        res = cluster.run(plan, batch, steps=steps, progress=False)

    def firings(trace):
        return Counter((e.rank, e.actor, e.lane, e.step, e.micro) for e in trace.events)

    assert firings(pred.trace) == firings(res.trace)
    assert len(pred.trace.flows) == len(res.trace.flows)
    assert len(res.step_times) == steps and all(t > 0 for t in res.step_times)
    cmp = pred.compare(res)
    assert cmp.data["step_time"]["measured"] > 0
    assert {(row["rank"], row["lane"]) for row in cmp.data["lanes"]} == {(0, "compute"), (0, "comm"),
                                                                          (1, "compute"), (1, "comm")}
    assert "step time: predicted" in cmp.table()
    fig = sl.compare_timelines(pred.trace, res.trace, labels=("predicted", "measured"))
    assert len(fig.data) > 0


ALIKE = [(lambda: sl.presets.dp_tp((2, 2)), 1), (lambda: sl.presets.pipeline(2, 2, 2, inner="dp"), 2),
         (lambda: sl.presets.pipeline(2, 2, 2, inner="tp"), 2)]  # tp: stage boundaries keep their split, 1:1


@pytest.mark.parametrize("strategy,classes", ALIKE, ids=["dp_tp_2x2", "pipeline_2_dp2", "pipeline_2_tp2"])
def test_simulating_ranks_alike_once_changes_nothing(monkeypatch, strategy, classes):
    import sbplab.sim.predict as predict

    model = sl.models.GPT(sl.models.GPTConfig(vocab_size=16, block_size=4, n_layer=1, n_head=2, n_embd=8))
    (x,), y = model.example_batch(4)
    c = sl.compile(model, (x,), loss_fn=sl.models.GPT.loss_fn, target=y, strategy=strategy())
    hw = sl.Hardware.cpu_box()
    merged = sl.simulate(c, hw)
    assert len(merged.classes) == classes
    alone = lambda plan, *args: {r: [r] for r in plan.ranks}  # noqa: E731
    monkeypatch.setattr(predict, "rank_classes", alone)
    monkeypatch.setattr(predict, "alike_ranks", alone)  # and every rank's shapes and costs its own
    every = sl.simulate(c, hw)
    assert len(every.classes) == len(every.plan.ranks)
    assert merged.step_time == pytest.approx(every.step_time, rel=1e-12)
    assert merged.peak_memory == every.peak_memory
    key = lambda e: (e.rank, e.actor, e.firing, round(e.start, 6), round(e.end, 6))  # noqa: E731
    assert sorted(map(key, merged.trace.events)) == sorted(map(key, every.trace.events))


def test_ranks_alike_share_shapes_and_costs_only_where_their_links_match(monkeypatch):
    """On one 8-GPU node the 2x2 ranks pair up as alike (one price per group) and the prediction is the one
    every rank priced on its own gives; with 3 GPUs per node each rank's tensor or data group crosses the
    node boundary its own way (ranks 0-2 on node 0, rank 3 on node 1), so no two are alike."""
    import warnings

    import sbplab.sim.predict as predict
    from sbplab.sim.alike import alike_ranks
    from sbplab.sim.predict import plan_of

    model = sl.models.GPT(sl.models.GPTConfig(vocab_size=16, block_size=4, n_layer=1, n_head=2, n_embd=8))
    (x,), y = model.example_batch(4)
    c = sl.compile(model, (x,), loss_fn=sl.models.GPT.loss_fn, target=y, strategy=sl.presets.dp_tp((2, 2)))
    plan, batch, known = plan_of(c)
    node, split = sl.Machine.a100_cluster(1), dataclasses.replace(sl.Machine.a100_cluster(2), devices_per_node=3)
    assert len(alike_ranks(plan, plan.micro_batches, batch, known, node)) < 4
    assert alike_ranks(plan, plan.micro_batches, batch, known, split) == {r: [r] for r in range(4)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.MemoryCapacityWarning)
        merged = sl.simulate(c, node)
        monkeypatch.setattr(predict, "alike_ranks", lambda plan, *args: {r: [r] for r in plan.ranks})
        alone = sl.simulate(c, node)
    assert merged.step_time == alone.step_time and merged.peak_memory == alone.peak_memory
    assert merged.classes == alone.classes


def test_a_fused_chain_pays_one_firing_overhead_as_the_runtime_fires_it_once():
    """w -> f1 -> f2 -> f3 -> upd: each the only reader of the one before, so the runtime fires the four
    as one actor (``runtime/fusion.py``); with empty kernels a step costs the State's firing overhead
    and the fused actor's, not five."""
    acts = [State("w", init=torch.zeros(8), update=Ref("upd")),
            Compute("f1", op=K + "relu", inputs=("w",), scope="step", registers=1),
            Compute("f2", op=K + "relu", inputs=("f1",), scope="step", registers=1),
            Compute("f3", op=K + "relu", inputs=("f2",), scope="step", registers=1),
            Compute("upd", op=K + "add", inputs=("w", "f3"), scope="step", phase="update", registers=1)]
    hw = dataclasses.replace(exact_hw({op_key(K + "relu", [(8,)], torch.float32, "cpu"): 0.0,
                                       op_key(K + "add", [(8,), (8,)], torch.float32, "cpu"): 0.0}),
                             firing_overhead=1 * MS)
    pred = simulate(ActorPlan.build(1, {0: acts}), hw, steps=3)
    assert pred.step_time == pytest.approx(2 * MS, rel=1e-9)
    assert Counter(e.actor for e in pred.trace.events) == {a.name: 3 for a in acts} | {"w": 4}
    # a second reader of f2 breaks the chain there: f1 -> f2 and f3 -> upd fuse, four firings pay
    read_f2 = [*acts, Compute("g", op=K + "relu", inputs=("f2",), scope="step", registers=1)]
    assert simulate(ActorPlan.build(1, {0: read_f2}), hw, steps=3).step_time == pytest.approx(4 * MS, rel=1e-9)
