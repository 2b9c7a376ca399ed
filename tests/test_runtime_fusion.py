"""Fused compute chains: which actors fuse, and a fused run is the plan's run: the same numbers to the
bit, every part in the trace, a failing part named."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import sbplab as sl
from sbplab.models import MLP, MLPConfig
from sbplab.runtime import ActorPlan, Compute, LocalCluster, Ref, RunError, Sink, Source, State
from sbplab.runtime.fusion import Fused, fuse_chains

K = "sbplab.runtime.kernels:"
PL1 = sl.Placement("cpu", [0])


def _names(actors, origin) -> list[list[str]]:
    return [[actors[i].name for i in o] for o in origin if len(o) > 1]


def test_a_chain_fuses_only_through_sole_readers_and_inputs_its_head_waited_for():
    acts = [
        Source("x", feed="x", placement=PL1, sbp="B"), Source("y", feed="y", placement=PL1, sbp="B"), State("w", init=torch.ones(2)),
        Compute("a", op=K + "relu", inputs=("x",)),
        Compute("b", op=K + "add", inputs=("a", "w")),  # a's only reader; w is no ancestor of a
        Compute("c", op=K + "relu", inputs=("x",)),
        Compute("d", op=K + "add", inputs=("c", "x")),  # x is an ancestor of c: fuses
        Compute("e", op=K + "relu", inputs=("d",)),
        Compute("f", op=K + "add", inputs=("e", "d")),  # d has two readers: the chain ends at d
        Compute("g", op=K + "add", inputs=("x", "y")),
        Compute("h", op=K + "relu", inputs=("g",)),  # g -> h fuses, g's inputs ride along
        *(Sink(f"s{n}", inputs=(n,), key=n, placement=PL1, sbp="B") for n in "bfh"),
    ]
    out, origin = fuse_chains(acts)
    assert _names(acts, origin) == [["c", "d"], ["e", "f"], ["g", "h"]]
    fused = {a.name: a for a in out if isinstance(a, Fused)}
    assert set(fused) == {"d", "f", "h"}  # named after the last part: its readers' refs still hold
    assert [r.actor for r in fused["d"].inputs] == ["x", "x"]  # every outside read stays a read (acks)
    assert fused["f"].wiring == (((-1, 0),), ((0, 0), (-1, 1)))
    assert fused["h"].label == f"{K}add+{K}relu"
    # the plan itself is untouched, and an actor list without chains comes back as it was
    assert [a.name for a in acts][:5] == ["x", "y", "w", "a", "b"]
    plain, ids = fuse_chains(acts[:5])
    assert plain == acts[:5] and ids == [[i] for i in range(5)]


def _gang_plan(update_reader: str = "state", extra_input: str | None = None) -> list:
    """x -> m -> n -> g (two outputs, a gradient each) -> updates u0, u1 of States w0, w1, which m and n
    read."""
    step = dict(scope="step")
    acts = [
        Source("x", feed="x", placement=PL1, sbp="B", **step), Source("y", feed="y", placement=PL1, sbp="B", **step),
        State("w0", init=torch.ones(2), update="u0", key="w0"), State("w1", init=torch.ones(2), update="u1", key="w1"),
        Compute("m", op=K + "add", inputs=("x", "w0"), **step),
        Compute("n", op=K + "add", inputs=("m", "w1"), **step),
        Compute("g", op=K + "noop", inputs=("n",), attrs={"outputs": 2}, outputs=2, phase="backward", **step),
        Compute("u0", op=K + "sgd", inputs=("w0", "g"), attrs={"lr": 0.5}, phase="update", **step),
        Compute("u1", op=K + "sgd", inputs=("w1", Ref("g", 1)) + ((extra_input,) if extra_input else ()),
                attrs={"lr": 0.5}, phase="update", **step),
        Sink("s", inputs=("n",), key="s", placement=PL1, sbp="B", **step),
    ]
    if update_reader == "late_state":  # u1 feeds a State nothing before g reads
        acts[3] = State("w1", init=torch.ones(2), update="u1", key="w1")
        acts[5] = Compute("n", op=K + "relu", inputs=("m",), **step)
        acts[8] = Compute("u1", op=K + "relu", inputs=(Ref("g", 1),), phase="update", **step)
    if update_reader == "compute":  # u1's output is also read by a compute actor
        acts += [Compute("peek", op=K + "relu", inputs=("u1",), phase="update", **step),
                 Sink("s2", inputs=("peek",), key="s2", placement=PL1, sbp="B", **step)]
    return acts


def test_an_optimizer_gang_fuses_a_multi_output_head_with_every_update_it_feeds():
    acts = _gang_plan()
    out, origin = fuse_chains(acts)
    assert _names(acts, origin) == [["g", "u0", "u1"]]
    gang = next(a for a in out if isinstance(a, Fused))
    assert gang.name == "g" and gang.exposed == ((1, 0), (2, 0)) and gang.outputs == 2
    states = {a.name: a for a in out if isinstance(a, State)}
    assert states["w0"].update == Ref("g", 0) and states["w1"].update == Ref("g", 1)  # the States read the gang
    assert [a.update for a in acts if isinstance(a, State)] == [Ref("u0"), Ref("u1")]  # the plan is untouched
    # an update whose output something other than a State reads, one that reads what the head did not
    # wait for (y is no ancestor of g), or one whose State no actor before g reads: g fires alone
    for bad in (_gang_plan(update_reader="compute"), _gang_plan(extra_input="y"), _gang_plan("late_state")):
        assert all("g" not in names for names in _names(bad, fuse_chains(bad)[1]))


@pytest.mark.multiprocess
def test_a_gang_runs_as_the_plan_does_and_as_plain_torch_computes():
    feeds = {"x": torch.tensor([0.5, -1.0]), "y": torch.zeros(2)}
    plan = ActorPlan.build(1, {0: _gang_plan()})
    with LocalCluster(1) as c:
        runs = {fuse: c.run(plan, feeds, steps=4, progress=False, fuse=fuse) for fuse in (True, False)}
    w0, w1, sums = torch.ones(2), torch.ones(2), []
    for _ in range(4):  # plain torch: both of g's outputs are n = x + w0 + w1, and u = w - lr * n
        n = feeds["x"] + w0 + w1
        sums.append(n)
        w0, w1 = w0 - 0.5 * n, w1 - 0.5 * n
    for res in runs.values():
        assert torch.equal(res.params["w0"][0], w0) and torch.equal(res.params["w1"][0], w1)
        assert all(torch.equal(got, want) for got, want in zip(res.outputs["s"], sums, strict=True))
    events = Counter(e.actor for e in runs[True].trace.events)
    assert events["g"] == events["u0"] == events["u1"] == 4  # every part of the gang is its own event


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(2) as c:
        yield c


@pytest.mark.multiprocess
@pytest.mark.parametrize("preset", ["tp", "pipeline", "dp", "zero"])
def test_a_fused_run_equals_the_unfused_one_bit_for_bit_and_traces_every_part(cluster, preset):
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=16, width=32, hidden=32, n_blocks=2))
    (x,), y = m.example_batch(16)
    strategy = {"tp": sl.presets.tensor_parallel(2), "pipeline": sl.presets.pipeline(2, 4),
                "dp": sl.presets.data_parallel(2), "zero": sl.presets.zero(2)}[preset]
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=strategy)
    plan = step.plan(world_size=2)
    chains = [o for r in plan.ranks.values() for o in fuse_chains(r.actors)[1] if len(o) > 1]
    assert chains  # there is something to fuse
    if preset == "dp":  # the bucket's unpack and every parameter's update: one gang per rank
        gangs = [a for r in plan.ranks.values() for a in fuse_chains(r.actors)[0] if getattr(a, "exposed", ())]
        assert len(gangs) == 2 and all(len(g.parts) == 1 + len(g.exposed) for g in gangs)
    runs = {fuse: cluster.run(step, (x, y), steps=3, progress=False, fuse=fuse, restart=True)  # both from the start
            for fuse in (True, False)}
    fused, plain = runs[True], runs[False]
    assert fused.losses == plain.losses
    assert all(torch.equal(fused.params[k].full(), plain.params[k].full()) for k in plain.params)

    def firings(res) -> Counter:
        return Counter((e.rank, e.actor, e.op, e.lane, e.firing) for e in res.trace.events)
    assert firings(fused) == firings(plain)  # every part of a fused chain is its own event
    for r, rp in plan.ranks.items():  # and the parts ran back to back, in chain order
        for chain in (o for o in fuse_chains(rp.actors)[1] if len(o) > 1):
            names = [rp.actors[i].name for i in chain]
            ev = {(e.actor, e.firing): e for e in fused.trace.events if e.rank == r and e.actor in names}
            for k in range(3 * plan.micro_batches if rp.actors[chain[0]].scope == "micro" else 3):
                parts = [ev[(n, k)] for n in names]
                assert all(p.end <= q.start for p, q in zip(parts, parts[1:])), names


@pytest.mark.multiprocess
def test_a_failing_part_of_a_fused_chain_is_named():
    acts = [Source("x", feed="x", placement=PL1, sbp="B"), Compute("a", op=K + "relu", inputs=("x",)),
            Compute("b", op=K + "fail", inputs=("a",), attrs={"message": "b broke"}),
            Compute("c", op=K + "relu", inputs=("b",)), Sink("s", inputs=("c",), key="s", placement=PL1, sbp="B")]
    assert _names(acts, fuse_chains(acts)[1]) == [["a", "b", "c"]]
    plan = ActorPlan.build(1, {0: acts})
    with LocalCluster(1) as c, pytest.raises(RunError) as e:
        c.run(plan, {"x": torch.ones(4)}, steps=1, progress=False)
    assert e.value.actor == "b" and "b broke" in str(e.value)
