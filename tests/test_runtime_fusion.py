"""Fused compute chains: which actors fuse, and a fused run is the plan's run: the same numbers to the
bit, every part in the trace, a failing part named."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import sbplab as sl
from sbplab.models import MLP, MLPConfig
from sbplab.runtime import ActorPlan, Compute, LocalCluster, RunError, Sink, Source, State
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


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(2) as c:
        yield c


@pytest.mark.parametrize("preset", ["tp", "pipeline"])
def test_a_fused_run_equals_the_unfused_one_bit_for_bit_and_traces_every_part(cluster, preset):
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=16, width=32, hidden=32, n_blocks=2))
    (x,), y = m.example_batch(16)
    strategy = sl.presets.tensor_parallel(2) if preset == "tp" else sl.presets.pipeline(2, 4)
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=strategy)
    plan = step.plan(world_size=2)
    chains = [o for r in plan.ranks.values() for o in fuse_chains(r.actors)[1] if len(o) > 1]
    assert chains  # there is something to fuse
    runs = {fuse: cluster.run(step, (x, y), steps=3, progress=False, fuse=fuse) for fuse in (True, False)}
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


def test_a_failing_part_of_a_fused_chain_is_named():
    acts = [Source("x", feed="x", placement=PL1, sbp="B"), Compute("a", op=K + "relu", inputs=("x",)),
            Compute("b", op=K + "fail", inputs=("a",), attrs={"message": "b broke"}),
            Compute("c", op=K + "relu", inputs=("b",)), Sink("s", inputs=("c",), key="s", placement=PL1, sbp="B")]
    assert _names(acts, fuse_chains(acts)[1]) == [["a", "b", "c"]]
    plan = ActorPlan.build(1, {0: acts})
    with LocalCluster(1) as c, pytest.raises(RunError) as e:
        c.run(plan, {"x": torch.ones(4)}, steps=1, progress=False)
    assert e.value.actor == "b" and "b broke" in str(e.value)
