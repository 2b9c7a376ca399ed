"""Boxing step kinds as objects: each kind's in-process run equals its torch.distributed run (Gloo, 2 and 4
ranks), its bytes and time follow BRIEF's table and the Hardware, its words explain it, and a new kind
is one class plus ``register``."""

from __future__ import annotations

import math
import multiprocessing as mp
import pickle
import traceback

import pytest
import torch

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.boxing.kinds import KINDS, StepKind, kind_of, kinds_between, registered
from sbplab.boxing.kinds.ring_kinds import AllReduceKind
from sbplab.hardware import CommFit
from sbplab.layout import random_shards
from sbplab.sbp import B, Partial, S, as_nd_sbp

SHAPE = (7, 6)  # dim 0 uneven over 2 and 4 ranks

# (mesh, src, dst) per world size; each plan's steps are checked one by one
CASES = {
    2: [([0, 1], "S(0)", "B"), ([0, 1], "P", "S(1)"), ([0, 1], "P(max)", "B"), ([0, 1], "S(0)", "S(1)"),
        ([0, 1], "B", "S(0)"), ([0, 1], "S(1)", "P"), ([0, 1], "B", "P"), ([0, 1], "P", "B")],
    4: [([0, 1, 2, 3], "S(0)", "B"), ([0, 1, 2, 3], "P", "S(0)"), ([0, 1, 2, 3], "P(min)", "B"),
        ([0, 1, 2, 3], "S(1)", "S(0)"), ([[0, 1], [2, 3]], "S(0), S(1)", "B, B"),
        ([[0, 1], [2, 3]], "P, S(0)", "S(1), B"), ([[0, 1], [2, 3]], "S(0), P", "B, S(0)"),
        ([0, 1, 2, 3], "B", "S(1)"), ([[0, 1], [2, 3]], "S(1), B", "S(1), P"), ([[0, 1], [2, 3]], "B, S(0)", "P, S(0)")],
}
MOVES = {2: [([0], "B", [1], "B"), ([0], "S(0)", [1], "S(1)")],
         4: [([0, 1], "S(0)", [2, 3], "S(1)"), ([[0, 1], [2, 3]], "P, S(0)", [[2, 3], [0, 1]], "P, S(0)")]}


def _shards(pl: sl.Placement, sbp: str, seed: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    full = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))
    nd = as_nd_sbp(sbp, pl.ndim, len(SHAPE))
    return full, random_shards(full, pl, nd, torch.Generator().manual_seed(seed + 1))


def _plans(world: int):
    for k, (mesh, src, dst) in enumerate(CASES[world]):
        pl = sl.Placement("cpu", mesh)
        yield f"{src} -> {dst} on {mesh}", plan_boxing(SHAPE, src, dst, pl), _shards(pl, src, k)[1]
    for k, (m0, src, m1, dst) in enumerate(MOVES[world]):
        pl0, pl1 = sl.Placement("cpu", m0), sl.Placement("cpu", m1)
        yield f"{src} on {m0} -> {dst} on {m1}", plan_boxing(SHAPE, src, dst, pl0, pl1), _shards(pl0, src, 50 + k)[1]


def _run_step_distributed(comm, step, cur, me: int):
    """This rank's result of ``step``, run the way the workers run it; also the bytes it reported."""
    from sbplab.runtime.specs import Collective, Recv, Send

    kind = step.kind_obj
    if kind.lowering == "kernel":
        if me not in cur:
            return None, 0
        fn, attrs = kind.kernel(step, me, tuple(cur[me].shape), SHAPE)
        return fn([cur[me]], attrs)[0], 0
    if kind.lowering == "collective":
        if me not in step.placement:
            return None, 0
        group = step.placement.group_of(me, step.mesh_axis)
        attrs = kind.collective_attrs(step, group, tuple(cur[me].shape), SHAPE)
        a = Collective("c", kind_=step.kind, group=group, inputs=("x",), mesh_axis=step.mesh_axis,
                       bytes_sent=step.bytes_sent[me], **attrs)
        pend = comm.post(a, cur[me], 1, 0)
        return pend.wait(), pend.nbytes
    from sbplab.layout import local_block

    pend, sent, inputs, takes, puts = [], 0, [], [], []
    for j, t in enumerate(step.transfers):
        src_block = local_block(SHAPE, step.src_placement, step.src_sbp, t.src_rank)
        if t.src_rank == me and t.dst_rank != me:
            fn, attrs = kind.take_kernel(t.block, src_block)
            p = comm.post(Send(f"s{j}", inputs=("x",), peer=t.dst_rank, tag=j), fn([cur[me]], attrs)[0], 1, 0)
            pend.append(p)
            sent += p.nbytes
    for j, t in enumerate(step.transfers):
        if t.dst_rank != me:
            continue
        dst_block = local_block(SHAPE, step.placement, step.dst_sbp, me)
        puts.append(tuple((s - o, e - o) for (s, e), (o, _) in zip(t.block, dst_block)))
        if t.src_rank == me:
            src_block = local_block(SHAPE, step.src_placement, step.src_sbp, me)
            inputs.append(cur[me])
            takes.append(tuple((s - o, e - o) for (s, e), (o, _) in zip(t.block, src_block)))
        else:
            shape = tuple(e - s for s, e in t.block)
            p = comm.post(Recv(f"r{j}", peer=t.src_rank, tag=j, shape=shape), None, 1, 0)
            inputs.append(p.wait())
            takes.append(None)
    for p in pend:
        p.wait()
    if me not in step.placement:
        return None, sent
    fn, attrs = kind.put_kernel(tuple(x for x in _local(step, me)), takes, puts)
    return fn(inputs, attrs)[0], sent


def _local(step, me):
    from sbplab.layout import local_shape

    return local_shape(SHAPE, step.placement, step.dst_sbp, me)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    from sbplab.runtime.comm import Comm

    checks = []
    try:
        Comm.init(rank, world, "cpu", init, timeout_s=60)
        comm = Comm(rank, world, "cpu", torch.device("cpu"))
        plans = list(_plans(world))
        groups = sorted({tuple(g) for _, plan, _ in plans for s in plan.steps if s.kind_obj.is_collective
                         for g in s.groups})
        pairs = sorted({tuple(sorted((t.src_rank, t.dst_rank))) for _, plan, _ in plans for s in plan.steps
                        for t in s.transfers if t.src_rank != t.dst_rank})
        comm.ensure_groups([list(g) for g in groups], pairs)
        for name, plan, shards in plans:
            cur = dict(shards)
            for k, step in enumerate(plan.steps):
                want = step.kind_obj.run_in_process(step, cur, SHAPE)
                got, nbytes = _run_step_distributed(comm, step, cur, rank)
                if got is not None:
                    same = got.shape == want[rank].shape and torch.allclose(got, want[rank], atol=1e-6)
                    checks.append((name, k, step.kind, same, nbytes, step.bytes_sent.get(rank, 0)))
                cur = want
        # broadcast: not a plan step; the source's value everywhere
        from sbplab.runtime.specs import Collective

        x = torch.full((3, 2), float(rank))
        a = Collective("bc", kind_="broadcast", group=tuple(range(world)), src=world - 1, inputs=("x",))
        pend = comm.post(a, x, 1, 0)
        want = kind_of("broadcast").value_of([torch.full((3, 2), float(r)) for r in range(world)], world - 1)
        checks.append(("broadcast", 0, "broadcast", torch.equal(pend.wait(), want[rank]), pend.nbytes,
                       24 if rank == world - 1 else 0))
    except Exception:
        checks.append(("error", -1, traceback.format_exc(), False, 0, 0))
    with open(out, "wb") as f:
        pickle.dump(checks, f)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _spawn(world: int, tmp_path) -> list[tuple]:
    ctx = mp.get_context("spawn")
    init = f"file://{tmp_path}/store"
    outs = [str(tmp_path / f"rank{r}.pkl") for r in range(world)]
    procs = [ctx.Process(target=_worker, args=(r, world, init, outs[r])) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"
    checks = []
    for o in outs:
        with open(o, "rb") as f:
            checks += pickle.load(f)
    return checks


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 4])
def test_in_process_apply_equals_the_torch_distributed_run(world, tmp_path):
    checks = _spawn(world, tmp_path)
    bad = [c for c in checks if not c[3]]
    assert not bad, bad
    kinds = {c[2] for c in checks}
    assert {"slice", "zero", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv",
            "broadcast"} <= kinds, kinds
    # the bytes a rank's run reports are the bytes its plan step says it sends
    assert all(c[4] == c[5] for c in checks), [c for c in checks if c[4] != c[5]]


# --- bytes and time --------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("src,dst,share", [("S(0)", "B", lambda T, p: T * (p - 1) // p),
                                           ("P", "S(1)", lambda T, p: T * (p - 1) // p),
                                           ("P", "B", lambda T, p: 2 * T * (p - 1) // p),
                                           ("S(0)", "S(1)", lambda T, p: T * (p - 1) // p ** 2),
                                           ("B", "S(1)", lambda T, p: 0), ("S(0)", "P", lambda T, p: 0)])
def test_bytes_and_time_follow_the_table(p, src, dst, share):
    shape = (8, 12)
    hw = sl.Hardware.cpu_box()
    plan = plan_boxing(shape, src, dst, sl.Placement("cpu", p), hardware=hw)
    (step,) = plan.steps
    T = 8 * 12 * 4
    assert set(step.bytes_sent.values()) == {share(T, p)}
    kind = step.kind_obj
    busiest = max(*step.bytes_sent.values(), *step.bytes_recv.values())
    if kind.moves_data:
        bw, lat = hw.link(0)
        assert kind.duration(hw, 0, p, busiest) == pytest.approx(lat * kind.rounds(p) + busiest / bw)
        assert step.time_s == pytest.approx(kind.duration(hw, 0, p, busiest))
    else:  # a local write at memory bandwidth (the zero fill), or nothing (the slice)
        assert step.time_s == pytest.approx(T * (kind.name == "zero") / hw.mem_bandwidth)


def test_a_calibrated_fit_prices_its_kind_only():
    base = sl.Hardware.cpu_box()
    hw = base.with_measurements(origin="test", comm_fits=[CommFit("all_gather", 0, 4, 1e-3, 1e8)])
    ag, ar = kind_of("all_gather"), kind_of("all_reduce")
    assert ag.duration(hw, 0, 4, 3000) == pytest.approx(3 * 1e-3 + 3000 / 1e8)
    assert ar.duration(hw, 0, 4, 3000) == ar.duration(base, 0, 4, 3000)
    pl = sl.Placement("cpu", 4)
    # a slow measured all-gather: the planner goes round it (zero fill, then all-reduce)
    assert plan_boxing((8, 12), "S(0)", "B", pl, hardware=hw).kinds == ("zero", "all_reduce")
    fast = base.with_measurements(origin="test", comm_fits=[CommFit("all_gather", 0, 4, 1e-6, 1e10)])
    plan = plan_boxing((8, 12), "S(0)", "B", pl, hardware=fast)
    assert plan.kinds == ("all_gather",) and plan.time_s == pytest.approx(3e-6 + 3 * 24 * 4 / 1e10)
    # point to point: one latency per message over the p2p link
    sr = kind_of("send_recv")
    assert sr.duration(base, None, 2, 1000) == pytest.approx(base.p2p_latency + 1000 / base.p2p_bandwidth)


def test_kinds_answer_instead_of_names():
    assert {k for k, v in KINDS.items() if v.is_collective} == {"all_to_all", "broadcast", "all_gather",
                                                                "reduce_scatter", "all_reduce"}
    assert {k for k, v in KINDS.items() if v.is_local} == {"slice", "zero", "copy"}
    assert {k for k, v in KINDS.items() if v.reduces} == {"reduce_scatter", "all_reduce"}
    assert {k for k, v in KINDS.items() if v.between_placements} == {"send_recv", "copy"}
    assert str(kind_of("all_gather")) == "all_gather"
    assert [k.name for k in kinds_between(Partial("sum"), B)] == ["all_reduce"]
    assert kinds_between(Partial("max"), Partial("sum")) == ()
    with pytest.raises(ValueError, match="no boxing step kind 'gather_all'; known kinds: .*all_gather"):
        kind_of("gather_all")


def test_uneven_bytes_are_the_padded_pieces_the_runtime_sends():
    """7 rows over 3 ranks: pieces 3, 2, 2 rows are padded to 3, so every rank forwards 2 x 3 rows."""
    plan = plan_boxing((7, 5), "S(0)", "B", sl.Placement("cpu", 3))
    assert set(plan.steps[0].bytes_sent.values()) == {2 * 3 * 5 * 4}
    plan = plan_boxing((5, 7), "P", "S(1)", sl.Placement("cpu", 3))
    assert set(plan.steps[0].bytes_sent.values()) == {2 * 5 * 3 * 4}


# --- words --------------------------------------------------------------------------------------------
def test_explanations():
    words = {
        ("slice", B, S(1)): "every rank on x holds the whole piece and keeps only its S(1) slice",
        ("zero", B, Partial("sum")): "the first rank on x keeps the value, the others hold zeros (a P addend)",
        ("zero", B, Partial("max")): "every rank on x keeps its copy, a valid P(max) candidate",
        ("zero", S(0), Partial("max")): "each rank on x puts its S(0) slice into a tensor filled with the "
                                         "identity of max",
        ("all_gather", S(0), B): "S(0) -> B on x: every rank needs the pieces of the others",
        ("reduce_scatter", Partial("sum"), S(1)): "P -> S(1) on x: reduce the partial values, each rank "
                                                  "keeps its slice",
        ("all_reduce", Partial("max"), B): "P(max) -> B on x: reduce the partial values everywhere",
        ("all_to_all", S(0), S(1)): "S(0) -> S(1) on x: exchange blocks so the split moves to dim 1",
    }
    for (name, old, new), text in words.items():
        assert kind_of(name).explain(old, new, "x") == text
    plan = plan_boxing((4, 4), "P(max)", "B", sl.Placement("cpu", 2))
    assert plan.steps[0].label == "all_reduce(max)" and "all_reduce(max)" in plan.describe()
    assert kind_of("all_gather").label("sum") == "all_gather"


# --- a new kind is one class ------------------------------------------------------------------------------
class TreeAllReduceKind(AllReduceKind):
    """P -> B as a tree: the ring's bytes, but 2 ceil(log2 p) latency steps instead of 2 (p - 1)."""

    name = "tree_all_reduce"

    def rounds(self, group_size: int, messages: int = 1) -> int:
        return 2 * math.ceil(math.log2(group_size)) if group_size > 1 else 0

    def explain(self, old, new, axis_label: str) -> str:
        return f"{old!r} -> B on {axis_label}: reduce up a tree and broadcast back down"


def test_registering_a_kind_is_all_it_takes():
    pl = sl.Placement("cpu", 4)
    before = plan_boxing((6, 4), "P(max)", "B", pl)
    assert before.kinds == ("all_reduce",)
    full = torch.randn(6, 4)
    shards = random_shards(full, pl, (Partial("max"),), torch.Generator().manual_seed(0))
    with registered(TreeAllReduceKind()) as kind:
        assert isinstance(kind, StepKind)
        plan = plan_boxing((6, 4), "P(max)", "B", pl)
        assert plan.kinds == ("tree_all_reduce",) and plan.time_s < before.time_s
        assert plan.steps[0].label == "tree_all_reduce(max)"
        assert "reduce up a tree and broadcast back down" in plan.describe()
        out = plan.run(shards)
        assert all(torch.equal(out[r], full) for r in pl.rank_list)
        # the runtime accepts it as a collective, and pictures count it as communication
        from sbplab.runtime.specs import Collective
        from sbplab.viz.timeline import event_kind

        Collective("c", kind_="tree_all_reduce", group=(0, 1, 2), inputs=("x",))
        assert event_kind({"args": {"op": "tree_all_reduce"}}) == "collective"
    assert "tree_all_reduce" not in KINDS
    assert plan_boxing((6, 4), "P(max)", "B", pl).kinds == before.kinds


def test_register_refuses_duplicates_and_non_kinds():
    from sbplab.boxing.kinds import register

    with pytest.raises(ValueError, match="'all_gather' exists already"):
        register(kind_of("all_gather").__class__())
    with pytest.raises(TypeError, match="StepKind with a name"):
        register(object())  # type: ignore[arg-type]


@pytest.mark.multiprocess
def test_uneven_gather_and_scatter_plan_bytes_equal_actor_bytes_equal_trace_bytes():
    """ZeRO on 2 ranks with odd widths: parameters all-gathered and gradients reduce-scattered in uneven
    pieces. The plan step, the lowered Collective and every trace event carry one number."""
    from sbplab.compiler import SGD, compile, presets
    from sbplab.compiler.lowering.to_actors import lower_to_actors
    from sbplab.models import MLP, MLPConfig
    from sbplab.runtime import Collective, LocalCluster

    torch.manual_seed(0)
    model = MLP(MLPConfig(in_dim=5, width=5, hidden=7, n_blocks=1, n_classes=3))
    xs, y = model.example_batch(6)
    comp = compile(model, xs, loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=SGD(lr=0.1),
                   strategy=presets.zero(2))
    plan = lower_to_actors(comp.physical, comp.graph, world_size=2, bucket_mb=0)  # one collective per step
    actors = {(r, a.name): a for r, rp in plan.ranks.items() for a in rp.actors if isinstance(a, Collective)}
    uneven = set()
    for (r, name), a in actors.items():
        pc = comp.physical.collectives[int(name[1:])]
        step = comp.deduction.boxings[pc.boxing].plan.steps[pc.step]
        assert a.bytes_sent == step.bytes_sent[r] == pc.bytes_sent[r] and a.mesh_axis == step.mesh_axis
        if a.sizes is not None and len(set(a.sizes)) > 1:
            uneven.add(a.kind_)
    assert {"all_gather", "reduce_scatter"} <= uneven
    with LocalCluster(2) as cluster:
        res = cluster.run(plan, dict(zip(comp.graph.inputs, [*xs, y])), steps=1, progress=False)
    events = [e for e in res.trace.events if (e.rank, e.actor) in actors]
    assert len(events) >= len(actors)
    assert all(e.bytes == actors[(e.rank, e.actor)].bytes_sent for e in events), \
        [(e.actor, e.bytes, actors[(e.rank, e.actor)].bytes_sent) for e in events]
