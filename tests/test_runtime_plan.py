"""Actor plans without processes: validation, the firing rule, the derived communication order, traces."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sbplab import B, P, Placement, S
from sbplab.layout import balanced_sizes, shard
from sbplab.runtime import (
    Accumulate,
    ActorPlan,
    Collective,
    CommSlot,
    Compute,
    LocalCluster,
    PlanError,
    Recv,
    Ref,
    Send,
    Sink,
    Source,
    State,
    Trace,
    TraceEvent,
)
from sbplab.runtime.actor_plan import channel_of, match_key
from sbplab.runtime.examples import data_parallel_linear, pipeline_mlp
from sbplab.runtime.firing import FiringGraph
from sbplab.runtime.results import cut_feeds, stack_values, unstack_values
from sbplab.runtime.schedule import derive_comm_order
from sbplab.runtime.trace import _pack_rows

K = "sbplab.runtime.kernels:"
PL1 = Placement("cpu", [0])


# --- validation -------------------------------------------------------------------------------------
def test_actor_fields_are_validated_with_the_invariant_in_the_message():
    with pytest.raises(PlanError, match="registers must be >= 1"):
        Compute("f", op=K + "noop", registers=0)
    with pytest.raises(PlanError, match="phase must be one of"):
        Compute("f", op=K + "noop", phase="sideways")
    with pytest.raises(PlanError, match="kind_ must be one of"):
        Collective("c", kind_="all_sum", group=(0, 1), inputs=("x",))
    with pytest.raises(PlanError, match="sizes needs one entry per group member"):
        Collective("c", kind_="all_gather", group=(0, 1), inputs=("x",), sizes=(1, 2, 3))
    with pytest.raises(PlanError, match="needs its initial local tensor"):
        State("w")


def test_rank_plan_rejects_dangling_and_out_of_range_refs():
    with pytest.raises(PlanError, match=r"reads 'nope', which no actor on this rank is named"):
        ActorPlan.build(1, {0: [Compute("f", op=K + "noop", inputs=("nope",))]})
    with pytest.raises(PlanError, match="reads output 1 of 'a', which has 1 outputs"):
        ActorPlan.build(1, {0: [Compute("a", op=K + "noop"),
                                Compute("b", op=K + "noop", inputs=(Ref("a", 1),))]})
    with pytest.raises(PlanError, match="two actors are named 'a'"):
        ActorPlan.build(1, {0: [Compute("a", op=K + "noop"), Compute("a", op=K + "noop")]})


def test_step_actor_reading_micro_register_needs_an_accumulate():
    acts = [Compute("g", op=K + "noop"), Compute("upd", op=K + "noop", inputs=("g",), scope="step")]
    with pytest.raises(PlanError, match="put an Accumulate between them"):
        ActorPlan.build(1, {0: acts})
    acts = [Compute("g", op=K + "noop"), Accumulate("acc", inputs=("g",)),
            Compute("upd", op=K + "noop", inputs=("acc",), scope="step")]
    assert ActorPlan.build(1, {0: acts}).ranks[0].by_name["upd"].scope == "step"


def test_collectives_match_by_name_across_their_group():
    def ar(**kw):
        return [Compute("x", op=K + "noop"), Collective("ar", group=(0, 1), inputs=("x",), **kw)]
    with pytest.raises(PlanError, match="has no collective of that name on rank 1"):
        ActorPlan.build(2, {0: ar(), 1: [Compute("x", op=K + "noop")]})
    with pytest.raises(PlanError, match="reduce_op is 'sum' on rank 0 but 'max' on rank 1"):
        ActorPlan.build(2, {0: ar(), 1: ar(reduce_op="max")})


def test_send_needs_its_matching_recv():
    send = [Compute("x", op=K + "noop"), Send("s", inputs=("x",), peer=1, tag=3)]
    with pytest.raises(PlanError, match=r"send 's' \(src 0 -> dst 1, tag 3\) has no matching recv"):
        ActorPlan.build(2, {0: send, 1: []})
    with pytest.raises(PlanError, match="valid peers are the other ranks"):
        ActorPlan.build(2, {0: [Compute("x", op=K + "noop"), Send("s", inputs=("x",), peer=0)]})


# --- the firing rule --------------------------------------------------------------------------------
def test_registers_bound_how_far_a_producer_runs_ahead():
    acts = [Compute("p", op=K + "noop", registers=2), Compute("c", op=K + "noop", inputs=("p",))]
    g = FiringGraph(acts, micro=5, steps=1)
    started = [g.start(0) for _ in range(2) if g.can_fire(0)]
    g.finish(0, 0)
    g.finish(0, 1)
    assert started == [0, 1] and not g.can_fire(0)  # both registers hold unacked outputs
    assert "free register" in g.waiting_for(0)
    k = g.start(1)
    g.finish(1, k)  # the consumer acks output 0
    assert g.can_fire(0) and g.nodes[0].released == 1


def test_step_register_read_by_micro_consumers_is_released_after_all_micro_batches():
    acts = [State("w", init=torch.zeros(1)), Compute("f", op=K + "noop", inputs=("w",))]
    g = FiringGraph(acts, micro=3, steps=2)
    g.finish(0, g.start(0))  # w emits step 0
    for _ in range(3):
        assert g.nodes[0].released == 0
        g.finish(1, g.start(1))
    assert g.nodes[0].released == 1 and g.nodes[0].needed_acks == 3


def test_state_takes_its_update_one_step_later_and_absorbs_the_last():
    acts = [State("w", init=torch.zeros(1), update=Ref("u")), Compute("u", op=K + "noop", inputs=("w",),
                                                                       scope="step")]
    g = FiringGraph(acts, micro=1, steps=2)
    assert g.nodes[0].total == 3  # emit step 0, emit step 1, absorb the final update
    g.finish(0, g.start(0))
    assert not g.can_fire(0)  # step 1's value needs step 0's update
    g.finish(1, g.start(1))
    assert g.can_fire(0)


def _can_fire_by_the_definition(g: FiringGraph, i: int) -> bool:
    """The rule as the module docstring states it, through in_number / register_number."""
    node = g.nodes[i]
    k = node.started
    if k >= node.total:
        return False
    for p, _, mode in node.inputs:
        o = g.in_number(mode, k)
        if o is not None and g.nodes[p].produced <= o:
            return False
    o = g.register_number(node, k)
    return o is None or o < node.released + node.actor.registers


@settings(max_examples=30, deadline=None)
@given(micro=st.integers(1, 4), steps=st.integers(1, 3), regs=st.lists(st.integers(1, 3), min_size=5, max_size=5),
       seed=st.integers(0, 10_000))
def test_can_fire_agrees_with_the_rule_under_random_firing_orders(micro, steps, regs, seed):
    """State -> micro compute -> Accumulate -> step compute updating the State, fired at random."""
    acts = [State("w", init=torch.zeros(1), update=Ref("u"), registers=regs[0]),
            Compute("f", op=K + "noop", inputs=("w",), registers=regs[1]),
            Compute("h", op=K + "noop", inputs=("f", "w"), registers=regs[2]),
            Accumulate("a", inputs=("h",), registers=regs[3]),
            Compute("u", op=K + "noop", inputs=("a", "w"), scope="step", registers=regs[4])]
    g = FiringGraph(acts, micro=micro, steps=steps)
    rng = random.Random(seed)
    running: list[tuple[int, int]] = []
    while not g.finished():
        fire = [i for i in range(len(acts)) if g.can_fire(i)]
        assert fire == [i for i in range(len(acts)) if _can_fire_by_the_definition(g, i)]
        if fire and (not running or rng.random() < 0.5):
            i = rng.choice(fire)
            running.append((i, g.start(i)))
        else:
            assert running, "nothing can fire and nothing runs: the rule deadlocked a valid chain"
            g.finish(*running.pop(rng.randrange(len(running))))
    assert all(n.done_upto == n.total for n in g.nodes)


# --- the communication order ------------------------------------------------------------------------
def test_dp_plan_orders_its_one_all_reduce_on_every_rank():
    plan = data_parallel_linear(3, torch.randn(4, 2), lr=0.1, batch=6, micro_batches=2)
    assert sorted(plan.comm_order) == [CommSlot(r, "ar", -1) for r in range(3)]


@pytest.mark.parametrize("stages", [2, 4])
def test_pipeline_order_is_identical_on_both_ends_of_every_channel(stages):
    ws = [torch.randn(3, 3) for _ in range(stages)]
    plan = pipeline_mlp(ws, lr=0.1, batch=12, micro_batches=6, registers=1)
    seqs: dict = {}
    for slot in plan.comm_order:
        a = plan.ranks[slot.rank].by_name[slot.actor]
        seqs.setdefault(channel_of(slot.rank, a), {}).setdefault(slot.rank, []).append(
            match_key(slot.rank, a, slot.micro))
    assert len(seqs) == stages - 1
    for by_rank in seqs.values():
        a, b = by_rank.values()
        assert a == b and len(a) == 2 * 6  # activations and gradients of six micro-batches
    # the explicit order passes the same validation a compiler-given order would
    again = ActorPlan(stages, plan.ranks, micro_batches=6, comm_order=plan.comm_order)
    assert again.rank_order(0) == plan.rank_order(0)


def test_inconsistent_explicit_order_is_rejected():
    plan = pipeline_mlp([torch.randn(2, 2)] * 2, lr=0.1, batch=4, micro_batches=2)
    slots = list(plan.comm_order)
    r1 = [s for s in slots if s.rank == 1]
    swapped = [s for s in slots if s.rank == 0] + r1[::-1]
    with pytest.raises(PlanError, match="every member must issue the same sequence"):
        ActorPlan(2, plan.ranks, micro_batches=2, comm_order=swapped)
    with pytest.raises(PlanError, match="must list each comm firing of rank 1 once per step"):
        ActorPlan(2, plan.ranks, micro_batches=2, comm_order=slots[:-1])


def test_a_plan_that_cannot_finish_is_reported_as_a_deadlock():
    # each rank waits to receive before it sends what the other waits for
    def side(peer):
        return [Recv("r", peer=peer, tag=0, shape=(1,)), Compute("f", op=K + "noop", inputs=("r",)),
                Send("s", inputs=("f",), peer=peer, tag=0)]
    with pytest.raises(PlanError, match=r"deadlocks(.|\n)*'r' firing 0 waits for|deadlocks") as e:
        ActorPlan.build(2, {0: side(1), 1: side(0)})
    assert "is ready only on" in str(e.value)


def test_a_given_order_that_would_deadlock_is_refused_before_anything_runs():
    # GPipe's order (all forwards, then all backwards) needs a register per micro-batch in flight
    def gpipe(regs):
        plan = pipeline_mlp([torch.zeros(2, 2)] * 2, lr=0.1, batch=8, micro_batches=4, registers=regs)
        order = [CommSlot(r, a, m) for m in range(4) for r, a in ((0, "a_out"), (1, "in"))]
        order += [CommSlot(r, a, m) for m in range(4) for r, a in ((1, "g_out"), (0, "g_in"))]
        return ActorPlan(2, plan.ranks, micro_batches=4, comm_order=order)
    with pytest.raises(PlanError, match="deadlocks with its given comm_order") as e:
        gpipe(1)
    assert "waits for a free register" in str(e.value)
    assert gpipe(4).rank_order(0)[:4] == [("a_out", m) for m in range(4)]


def test_derived_order_is_deterministic():
    ws = [torch.randn(3, 3) for _ in range(3)]
    plan = pipeline_mlp(ws, lr=0.1, batch=8, micro_batches=4)
    assert derive_comm_order(plan) == plan.comm_order


# --- feeds ------------------------------------------------------------------------------------------
def test_feeds_are_cut_into_micro_batches_then_shards():
    plan = data_parallel_linear(2, torch.randn(3, 2), lr=0.1, batch=10, micro_batches=2)
    x = torch.arange(30.0).reshape(10, 3)
    feeds = cut_feeds(plan, {"x": x, "t": torch.zeros(10, 2)}, steps=2)
    pl = Placement("cpu", [0, 1])
    for m, (a, b) in enumerate([(0, 5), (5, 10)]):
        want = shard(x[a:b], pl, (S(0),))
        for r in (0, 1):
            assert torch.equal(feeds[r]["x"][m], want[r]) and torch.equal(feeds[r]["x"][2 + m], want[r])
    assert [f.shape[0] for f in feeds[0]["x"][:2]] == [balanced_sizes(5, 2)[0]] * 2
    with pytest.raises(PlanError, match="has only \\['x'\\]"):
        cut_feeds(plan, {"x": x}, steps=1)


# --- traces -----------------------------------------------------------------------------------------
def _events():
    return [TraceEvent(0, "compute", "f", "matmul", "compute", "forward", 0, 0, 0, 0.0, 10.0),
            TraceEvent(0, "comm", "s", "send", "send", "forward", 0, 0, 0, 10.0, 30.0, 64),
            TraceEvent(0, "comm", "ar", "all_reduce", "collective", "backward", 0, -1, 0, 20.0, 40.0, 128),
            TraceEvent(1, "comm", "r", "recv", "recv", "forward", 0, 0, 0, 5.0, 31.0, 64),
            TraceEvent(1, "compute", "g", "relu", "compute", "forward", 0, 0, 0, 31.0, 35.0)]


def test_chrome_trace_has_one_complete_event_per_firing_and_flow_pairs(tmp_path):
    tr = Trace(_events(), flows=[(0, 1), (1, 3), (3, 4)])
    doc = tr.to_chrome(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == doc
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["name"], e["ts"], e["dur"]) for e in xs] == \
        [(e.rank, e.actor, e.start, e.dur) for e in tr.events]
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    ends = [e for e in doc["traceEvents"] if e["ph"] == "f"]
    assert [s["id"] for s in starts] == [f["id"] for f in ends] == [0, 1, 2]
    assert ends[1]["pid"] == 1 and starts[1]["pid"] == 0  # the send -> recv arrow crosses ranks
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "thread_name"}
    assert names[(0, 0)] == "compute" and names[(0, 1)] == "comm" and names[(0, 2)] == "comm 1"


def test_overlapping_communication_is_spread_over_rows():
    rows = _pack_rows(_events())
    assert rows == [0, 1, 2, 1, 0]  # the all-reduce overlaps the send on rank 0


def test_non_loopback_driver_needs_a_token():
    with pytest.raises(ValueError, match="needs a shared token"):
        LocalCluster(2, launch="external", host="0.0.0.0")


def test_sink_and_source_layouts_are_checked():
    with pytest.raises(PlanError, match="needs a key and a placement"):
        Sink("o", inputs=("x",))
    src = Source("x", feed="x", placement=Placement("cpu", [0, 1]), sbp="S(0)")
    assert src.sbp == (S(0),)
    sink = Sink("o", inputs=("x",), key="loss", placement=PL1, sbp=P)
    assert sink.sbp == (P,) and State("w", init=torch.ones(1), placement=PL1, sbp="B").sbp == (B,)


def _replay(plan: ActorPlan, rng: random.Random) -> None:
    """Run one step under random timing: any ready compute fires, comm is posted in each rank's order
    without waiting, a transfer completes once every side posted it. Fails if it gets stuck."""
    M = plan.micro_batches
    graphs = {r: FiringGraph(rp.actors, M, steps=1) for r, rp in plan.ranks.items()}
    order = {r: plan.rank_order(r) for r in plan.ranks}
    pos = {r: 0 for r in plan.ranks}
    posted: dict[tuple, list[tuple[int, int, int]]] = {}
    size = {}
    for slot in plan.comm_order:
        a = plan.ranks[slot.rank].by_name[slot.actor]
        key = match_key(slot.rank, a, slot.micro)
        size[key] = size.get(key, 0) + 1
    while not all(g.finished() for g in graphs.values()):
        moves = []
        for r, g in graphs.items():
            moves += [("compute", r, i) for i, n in enumerate(g.nodes)
                      if n.actor.lane != "comm" and g.can_fire(i)]
            if pos[r] < len(order[r]):
                name, m = order[r][pos[r]]
                if g.can_fire(g.names[name]):
                    moves.append(("post", r, g.names[name]))
        moves += [("complete", key, 0) for key, parts in posted.items() if len(parts) == size[key]]
        assert moves, "stuck: the derived order deadlocks under this timing"
        kind, a, b = rng.choice(moves)
        if kind == "compute":
            graphs[a].finish(b, graphs[a].start(b))
        elif kind == "post":
            g = graphs[a]
            name, m = order[a][pos[a]]
            pos[a] += 1
            posted.setdefault(match_key(a, g.nodes[b].actor, m), []).append((a, b, g.start(b)))
        else:
            for r, i, k in posted.pop(a):
                graphs[r].finish(i, k)


@settings(max_examples=25, deadline=None)
@given(stages=st.integers(1, 4), micro=st.integers(1, 6), registers=st.integers(1, 3))
def test_any_pipeline_shape_gets_an_order_that_completes_under_random_timing(stages, micro, registers):
    ws = [torch.zeros(2, 2) for _ in range(stages)]
    plan = pipeline_mlp(ws, lr=0.1, batch=2 * micro, micro_batches=micro, registers=registers)
    for r in plan.ranks:  # every comm firing of the step, each once
        assert sorted(plan.rank_order(r)) == sorted(plan.expected_slots(r))
    rng = random.Random(stages * 100 + micro * 10 + registers)
    for _ in range(3):  # the order was derived under unit costs; it must hold under any timing
        _replay(plan, rng)


def test_sink_values_travel_stacked_when_they_can_and_come_back_one_per_firing():
    losses = [torch.tensor(float(k)) / 3 for k in range(5)]
    packed = stack_values(losses)
    assert isinstance(packed, torch.Tensor) and packed.shape == (5,)
    back = unstack_values(packed)
    assert len(back) == 5 and all(torch.equal(a, b) and a.shape == () for a, b in zip(back, losses))
    uneven = [torch.ones(3), torch.ones(2)]  # uneven micro-batches: shapes differ, sent as they are
    assert stack_values(uneven) is uneven and unstack_values(uneven) is uneven
    mixed = [torch.ones(2), torch.ones(2, dtype=torch.float64)]
    assert stack_values(mixed) is mixed
    assert stack_values(losses[:1]) == losses[:1]
