"""Hand-built actor plans on real worker processes over Gloo, checked against single-device PyTorch."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sbplab import B, P, Placement, S
from sbplab.layout import assemble, balanced_sizes, shard
from sbplab.runtime import ActorPlan, Collective, Compute, LocalCluster, Recv, Ref, Send, Sink, State
from sbplab.runtime.examples import data_parallel_linear, pipeline_mlp, reference_mlp_steps

pytestmark = pytest.mark.multiprocess
K = "sbplab.runtime.kernels:"


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(4) as c:
        yield c


def _batches(steps, batch, d_in, d_out, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(batch, d_in, generator=g), "t": torch.randn(batch, d_out, generator=g)}
            for _ in range(steps)]


def _check_quota(plan: ActorPlan, trace) -> int:
    """Producer firing k + R starts only after every consumer read output k (micro-scope chains)."""
    checked = 0
    for r, rp in plan.ranks.items():
        ev = {(e.actor, e.firing): e for e in trace.select(rank=r)}
        for p in rp.actors:
            if p.scope != "micro" or p.out_scope != "micro" or not p.num_outputs:
                continue
            cons = [c for c in rp.actors
                    if c.scope == "micro" and any(ref.actor == p.name for ref in c.inputs)]
            k = 0
            while (p.name, k + p.registers) in ev and cons:
                later = ev[(p.name, k + p.registers)]
                assert later.start >= max(ev[(c.name, k)].end for c in cons) - 1e-3, (r, p.name, k)
                checked += 1
                k += 1
    return checked


@pytest.mark.parametrize("n,micro", [(2, 1), (4, 2)])
def test_data_parallel_linear_matches_single_device(cluster, n, micro):
    torch.manual_seed(n)
    w0 = torch.randn(6, 3)
    batches = _batches(3, 16, 6, 3, seed=n)
    plan = data_parallel_linear(n, w0, lr=0.1, batch=16, micro_batches=micro)
    res = cluster.run(plan, batches, steps=3, progress=False)
    ref_losses, ref_w = reference_mlp_steps([w0], batches, 0.1, 3)
    assert res.losses == pytest.approx(ref_losses, rel=1e-5)
    assert torch.allclose(res.params["w"].full(), ref_w[0], atol=1e-6)
    # one all-reduce per step and rank, of the (6, 3) gradient: ring bytes 2T - c[i] - c[i+1] (2T(p-1)/p)
    ars = trace_ars = res.trace.select(actor="ar")
    assert len(ars) == 3 * n and {e.rank for e in trace_ars} == set(range(n))
    c = balanced_sizes(18, n)
    assert all(e.bytes == (36 - c[e.rank] - c[(e.rank + 1) % n]) * 4 for e in ars)


@pytest.mark.parametrize("stages,ms", [(2, [4, 0]), (4, [1, 5, 2, 8])])
def test_pipeline_more_micro_batches_than_registers_with_unequal_stage_costs(cluster, stages, ms):
    torch.manual_seed(stages)
    ws = [torch.randn(5, 5) * 0.5 for _ in range(stages)]
    batches = _batches(2, 12, 5, 5, seed=stages)
    plan = pipeline_mlp(ws, lr=0.05, batch=12, micro_batches=6, registers=2, stage_ms=ms)
    res = cluster.run(plan, batches, steps=2, progress=False)
    ref_losses, ref_ws = reference_mlp_steps(ws, batches, 0.05, 2)
    assert res.losses == pytest.approx(ref_losses, rel=1e-5)
    for s in range(stages):
        assert torch.allclose(res.params[f"w{s}"].full(), ref_ws[s], atol=1e-6)
    assert _check_quota(plan, res.trace) > 0
    # stages overlap: stage 1 starts micro-batch 0 before stage 0 finished its forwards of the step
    s0 = [e for e in res.trace.select(rank=0, actor="h") if e.step == 0]
    s1 = [e for e in res.trace.select(rank=1, actor="h") if e.step == 0]
    assert min(e.start for e in s1) < max(e.end for e in s0)


def test_figure2_fork_join_across_devices_under_a_memory_quota(cluster):
    """A producer forks into a fast local branch and a slow branch on another device, which then join.

    Every tensor has a quota of one register, and there are more micro-batches than that: the
    producer must wait for both branches (resource dependencies, not only data dependencies), and
    nothing may deadlock. Registry ops and plain kernels are mixed.
    """
    torch.manual_seed(2)
    w0, w1 = torch.randn(4, 4), torch.randn(4, 4)
    pl0, pl1 = Placement("cpu", [0]), Placement("cpu", [1])
    from sbplab.runtime import Source

    r0 = [Source("x", feed="x", placement=pl0, sbp=(B,), registers=1),
          State("w0", init=w0, key="w0", placement=pl0, sbp=(B,), registers=1),
          Compute("p", op="matmul", inputs=("x", "w0"), registers=1),
          Compute("a", op="relu", inputs=("p",), registers=1),
          Send("to1", inputs=("p",), peer=1, tag=0, registers=1),
          Recv("from1", peer=1, tag=1, shape=(2, 4), registers=1),
          Compute("j", op="add", inputs=("a", "from1"), registers=1),
          Sink("out", inputs=("j",), key="y", placement=pl0, sbp=(B,), micro_reduce="stack")]
    r1 = [Recv("in", peer=0, tag=0, shape=(2, 4), registers=1),
          State("w1", init=w1, key="w1", placement=pl1, sbp=(B,), registers=1),
          Compute("slow", op=K + "delay", inputs=("in",), attrs={"ms": 5}, registers=1),
          Compute("b", op="relu", inputs=("slow",), registers=1),
          Compute("bw", op="matmul", inputs=("b", "w1"), registers=1),
          Send("back", inputs=("bw",), peer=0, tag=1, registers=1)]
    plan = ActorPlan.build(2, {0: r0, 1: r1}, micro_batches=5, name="figure-2")
    x = torch.randn(10, 4)
    res = cluster.run(plan, {"x": x}, steps=2, progress=False)
    h = torch.relu(x @ w0)
    want = h + h @ w1
    for step in range(2):
        assert torch.allclose(res.outputs["y"][step].reshape(10, 4), want, atol=1e-5)
    assert _check_quota(plan, res.trace) >= 8


def test_every_collective_kind_with_uneven_pieces(cluster):
    """all_gather, reduce_scatter, all_to_all, all_reduce(max) and broadcast on 3 of the 4 ranks."""
    torch.manual_seed(3)
    pl = Placement("cpu", [0, 1, 2])
    g = (0, 1, 2)
    x = torch.randn(7, 5)  # S(0): rows 3, 2, 2
    parts = [torch.randn(3, 7) for _ in g]  # P: addends; reduce-scattered along dim 1 into 3, 2, 2
    xs = shard(x, pl, (S(0),))
    ranks = {}
    for r in g:
        mine = Placement("cpu", [r])
        ranks[r] = [
            State("x", init=xs[r], registers=1), State("p", init=parts[r], registers=1),
            Collective("ag", kind_="all_gather", group=g, inputs=("x",), dim=0, sizes=balanced_sizes(7, 3),
                       scope="step"),
            Collective("rs", kind_="reduce_scatter", group=g, inputs=("p",), dim=1,
                       sizes=balanced_sizes(7, 3), scope="step"),
            Collective("a2a", kind_="all_to_all", group=g, inputs=("x",), dim=1, cat_dim=0,
                       sizes=balanced_sizes(5, 3), cat_sizes=balanced_sizes(7, 3), scope="step"),
            Collective("mx", kind_="all_reduce", reduce_op="max", group=g, inputs=("p",), scope="step"),
            Collective("bc", kind_="broadcast", src=2, group=g, inputs=("p",), scope="step"),
            Sink("o_ag", inputs=("ag",), key=f"ag{r}", placement=mine, sbp=(B,), scope="step"),
            Sink("o_rs", inputs=("rs",), key="rs", placement=pl, sbp=(S(1),), scope="step"),
            Sink("o_a2a", inputs=("a2a",), key="a2a", placement=pl, sbp=(S(1),), scope="step"),
            Sink("o_mx", inputs=("mx",), key=f"mx{r}", placement=mine, sbp=(B,), scope="step"),
            Sink("o_bc", inputs=("bc",), key=f"bc{r}", placement=mine, sbp=(B,), scope="step"),
        ]
    res = cluster.run(ActorPlan.build(3, ranks, name="collectives"), steps=1, progress=False)
    out = {k: v[0] for k, v in res.outputs.items()}
    full_p = sum(parts)
    assert torch.allclose(out["rs"], full_p, atol=1e-6)
    assert torch.equal(out["a2a"], x)
    for r in g:
        assert torch.equal(out[f"ag{r}"], x)
        assert torch.equal(out[f"mx{r}"], torch.stack(parts).amax(0))
        assert torch.equal(out[f"bc{r}"], parts[2])
    assert torch.equal(assemble({r: out[f"ag{r}"] for r in g}, pl, (B,)), x)
    assert {e.op for e in res.trace.events if e.lane == "comm"} == \
        {"all_gather", "reduce_scatter", "all_to_all", "all_reduce", "broadcast"}


def test_trace_is_on_one_clock_and_exports_to_chrome(cluster, tmp_path):
    ws = [torch.randn(4, 4) * 0.5 for _ in range(2)]
    plan = pipeline_mlp(ws, lr=0.05, batch=8, micro_batches=4, stage_ms=[2, 2])
    res = cluster.run(plan, _batches(1, 8, 4, 4), steps=1, progress=False)
    tr = res.trace
    want = sum(n for rp in plan.ranks.values() for a in rp.actors
               for n in [4 if a.scope == "micro" else (2 if isinstance(a, State) else 1)])
    assert len(tr) == want  # every firing of every actor, no more
    # causality across processes after clock correction: a recv ends after its send started
    ev = {(e.rank, e.actor, e.firing): e for e in tr.events}
    for k in range(4):
        assert ev[(1, "in", k)].end >= ev[(0, "a_out", k)].start
        assert ev[(0, "g_in", k)].end >= ev[(1, "g_out", k)].start
    doc = tr.to_chrome(tmp_path / "trace.json")
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded == doc
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tr) and {e["pid"] for e in xs} == {0, 1}
    flows = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    cross = [(a, b) for a, b in tr.flows if tr.events[a].rank != tr.events[b].rank]
    assert len(flows) == len(tr.flows) and len(cross) == 8  # 4 activations forward, 4 gradients back


def test_cluster_is_reused_and_shows_progress(cluster, capfd):
    w0 = torch.randn(3, 2)
    plan = data_parallel_linear(4, w0, lr=0.1, batch=8)
    pids = list(cluster.pids)
    a = cluster.run(plan, _batches(3, 8, 3, 2), steps=3, progress=True)
    b = cluster.run(plan, _batches(3, 8, 3, 2), steps=3, progress=False)
    assert cluster.pids == pids and a.losses == b.losses
    err = capfd.readouterr().err
    assert "3/3" in err and f"loss={a.losses[-1]:.4g}" in err  # the bar shows the last step's loss


def test_on_step_reports_every_step_in_order_with_its_loss(cluster):
    """Micro-batched DP on 4 ranks: the loss of each step is assembled from the sinks of all ranks."""
    torch.manual_seed(5)
    w0 = torch.randn(6, 3)
    batches = _batches(4, 16, 6, 3, seed=5)
    plan = data_parallel_linear(4, w0, lr=0.1, batch=16, micro_batches=2)
    calls = []
    res = cluster.run(plan, batches, steps=4, progress=False, on_step=lambda *a: calls.append(a))
    assert [c[:2] for c in calls] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [c[2] for c in calls] == res.losses  # the very values of the result, step by step
    assert res.losses == pytest.approx(reference_mlp_steps([w0], batches, 0.1, 4)[0], rel=1e-5)
    # a plan without a "loss" sink still reports its steps
    got = []
    ranks = {r: [State("x", init=torch.ones(2)), Sink("o", inputs=("x",), key=f"y{r}", placement=Placement("cpu", [r]),
                                                     sbp=(B,), scope="step")] for r in range(2)}
    cluster.run(ActorPlan.build(2, ranks), steps=2, progress=False, on_step=lambda *a: got.append(a))
    assert got == [(0, 2, None), (1, 2, None)]
    with pytest.raises(TypeError, match="on_step must be a function"):
        cluster.run(plan, batches, steps=1, progress=False, on_step="print")


def test_on_step_is_called_while_the_run_goes_on(cluster, tmp_path):
    """Step n of each rank waits at a gate for a file that only the callback of step n - 1 creates,
    so the run can only finish if every step was reported while later steps were still to come."""
    gate = str(tmp_path / "seen")
    pl = Placement("cpu", [0, 1])
    ranks = {r: [State("x", init=torch.zeros(1), update=Ref("inc")),  # x = the step number
                 State("one", init=torch.ones(1)),
                 Compute("g", op=K + "gate", inputs=("x",), attrs={"path": gate, "timeout": 20.0}, scope="step"),
                 Compute("inc", op=K + "sgd", inputs=("g", "one"), attrs={"lr": -1.0}, scope="step"),
                 Sink("loss", inputs=("g",), key="loss", placement=pl, sbp=(P,), scope="step")] for r in (0, 1)}
    calls = []

    def on_step(step, steps, loss):
        calls.append((step, steps, loss))
        (tmp_path / f"seen.{step + 1}").touch()

    res = cluster.run(ActorPlan.build(2, ranks, name="gated"), steps=4, timeout=60.0, progress=False,
                      on_step=on_step)
    assert calls == [(s, 4, 2.0 * s) for s in range(4)] and res.losses == [0.0, 2.0, 4.0, 6.0]


def test_second_cluster_in_the_same_process_and_close_leaves_nothing(cluster):
    w0 = torch.randn(3, 2)
    with LocalCluster(1) as other:
        assert other.address != cluster.address
        res = other.run(data_parallel_linear(1, w0, lr=0.1, batch=4), _batches(1, 4, 3, 2), progress=False)
        pids = other.pids
        assert res.losses == pytest.approx(reference_mlp_steps([w0], _batches(1, 4, 3, 2), 0.1, 1)[0])
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert cluster.alive  # the first cluster is untouched


@pytest.mark.skipif(not any("libgomp" in line for line in open("/proc/self/maps")), reason="torch without libgomp")
def test_a_firing_runs_with_the_workers_thread_count_for_openmp_too():
    """OpenMP keeps its thread count per thread; firings run on the worker's run thread, not the one that set
    it at start-up. A kernel that goes to OpenMP directly (oneDNN's convolutions) must see the worker's
    count, not one thread per core of the machine, whose spinning would take the other ranks' cores."""
    plan = ActorPlan.build(1, {0: [
        Compute("probe", op="omp_probe:openmp_threads", scope="step"),
        Sink("s", inputs=("probe",), key="threads", scope="step", placement=Placement("cpu", [0]), sbp="B"),
    ]})
    with LocalCluster(1, threads=1) as c:
        res = c.run(plan, {}, steps=2, progress=False)
    assert [float(v) for v in res.outputs["threads"]] == [1.0, 1.0]
