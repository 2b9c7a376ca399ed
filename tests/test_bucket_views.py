"""Gradients written straight into their bucket (``gradient_as_bucket_view``): the ``into`` forms of the
ATen ops a gradient comes from equal their plain kernels bit for bit, the firing rule keeps a reused buffer from being
overwritten while it is still read, the simulator prices a pack that moves nothing as a firing only,
and on real Gloo workers the gradients are views of the one buffer the all-reduce runs on, the same
buffer every step, while the run trains like single-device torch and gives the very bits of a run
that copies every gradient into the bucket."""

from __future__ import annotations

import copy

import pytest
import torch

import sbplab as sl
from sbplab.boxing.bucket_kernels import pack_bucket
from sbplab.boxing.kinds import kernel_ref
from sbplab.compiler import SGD, compile, presets
from sbplab.ops.aten.calls import Slot
from sbplab.ops.aten.into import OUT_OVERLOADS
from sbplab.ops.registry import REGISTRY, get_op
from sbplab.placement import Placement
from sbplab.runtime import ActorPlan, Compute, LocalCluster, Ref, Sink
from sbplab.runtime.buffers import BufferPools, BufferSlot
from sbplab.runtime.firing import FiringGraph
from sbplab.runtime.specs import Accumulate, PlanError, State
from sbplab.sbp import B
from sbplab.sim.firing_cost import compute_cost
from sbplab.sim.predict import plan_of
from sbplab.sim.shapes import infer_rank_shapes

PACK = kernel_ref(pack_bucket)
K = "sbplab.runtime.kernels:"

S0, S1, S2 = Slot(0), Slot(1), Slot(2)
INTO_CASES = {  # op -> (inputs, attrs) for a local instance: the ops a parameter's gradient comes from
    "aten.mm.default": (lambda g: [torch.randn(5, 12, generator=g), torch.randn(12, 3, generator=g)],
                        {"args": (S0, S1), "kwargs": ()}),
    "aten.bmm.default": (lambda g: [torch.randn(2, 5, 6, generator=g), torch.randn(2, 6, 3, generator=g)],
                         {"args": (S0, S1), "kwargs": ()}),
    "aten.addmm.default": (lambda g: [torch.randn(3, generator=g), torch.randn(5, 6, generator=g),
                                      torch.randn(6, 3, generator=g)], {"args": (S0, S1, S2), "kwargs": ()}),
    "aten.sum.dim_IntList": (lambda g: [torch.randn(6, 4, 3, generator=g)], {"args": (S0, (0, 2), False), "kwargs": ()}),
}


def test_every_into_kernel_is_tested_here():
    assert set(OUT_OVERLOADS) == set(INTO_CASES)
    assert {name for name, op in REGISTRY.items() if op.kernel_into is not None} <= set(INTO_CASES)


@pytest.mark.parametrize("name", sorted(INTO_CASES))
def test_into_kernel_writes_exactly_what_the_kernel_returns_into_a_view(name):
    g = torch.Generator().manual_seed(0)
    make, attrs = INTO_CASES[name]
    xs = make(g)
    op = get_op(name)
    want = op.kernel(xs, attrs)[0]
    buf = torch.full((want.numel() + 7,), float("nan"))
    view = buf[3: 3 + want.numel()].view(want.shape)  # an offset view, as in a bucket
    op.kernel_into(xs, attrs, view)
    assert torch.equal(view, want)
    assert buf[:3].isnan().all() and buf[3 + want.numel():].isnan().all()  # nothing written outside


def test_pack_copies_only_gradients_not_in_place():
    xs = [torch.randn(2, 3), torch.randn(4)]
    attrs = {"offsets": (0, 6), "shapes": ((2, 3), (4,)), "in_place": (True, False)}
    out = torch.zeros(10)
    out[:6] = 7.0  # what gradient 0's producer wrote there itself
    pack_bucket.into(xs, attrs, out)
    assert torch.equal(out[:6], torch.full((6,), 7.0)) and torch.equal(out[6:], xs[1])
    assert pack_bucket.moved_bytes([24, 16], attrs) == 2 * 16  # the simulator's bytes: the copy only
    assert torch.equal(pack_bucket(xs, attrs)[0], torch.cat([xs[0].reshape(-1), xs[1]]))  # no buffer: a copy


def _guarded_plan(registers: int) -> list:
    """g writes into pool ``u`` (u's registers buffers); p packs; u views; c reads u's view."""
    slot = BufferSlot("u", 0, (4,))
    return [State("w", init=torch.ones(4)),
            Compute("g", op=K + "noop", inputs=("w",), into=slot, scope="step", registers=4),
            Compute("p", op=K + "noop", inputs=("g",), scope="step", registers=4),
            Compute("u", op=K + "noop", inputs=("p",), scope="step", registers=registers),
            Compute("c", op=K + "noop", inputs=("u",), scope="step", registers=4)]


@pytest.mark.parametrize("registers", [1, 2])
def test_a_buffer_is_reused_only_after_its_last_readers_released_it(registers):
    """Output o of g lives in buffer o % registers(u): g's firing o waits until u released o - registers."""
    g = FiringGraph(_guarded_plan(registers), 1, 6)
    idx = g.names

    def run(name: str) -> None:
        i = idx[name]
        assert g.can_fire(i), g.waiting_for(i)
        g.finish(i, g.start(i))

    for _ in range(registers):  # every buffer once, nothing read yet
        for name in "wgpu":
            run(name)
    run("w")
    assert not g.can_fire(idx["g"])  # its inputs are there and it has free registers: only the buffer
    assert "shared buffer" in g.waiting_for(idx["g"])
    touched = g.finish(idx["c"], g.start(idx["c"]))  # the last reader of output 0 is done with it
    assert idx["g"] in touched  # the writer is woken where the buffer frees
    assert g.can_fire(idx["g"])


def test_into_must_name_an_actor_with_outputs_of_the_same_scope():
    acts = _guarded_plan(1)
    acts[1] = Compute("g", op=K + "noop", inputs=("w",), into=BufferSlot("nobody", 0, (4,)), scope="step")
    with pytest.raises(PlanError, match="writes into the buffers of 'nobody'"):
        ActorPlan.build(1, {0: acts})
    with pytest.raises(PlanError, match="exactly one output"):
        Compute("two", op=K + "noop", outputs=2, into=BufferSlot("u", 0, (4,)))
    with pytest.raises(PlanError, match="exactly one output"):
        Accumulate("acc", inputs=("a", "b"), into=BufferSlot("u", 0, (4,)))


def test_pools_hold_one_buffer_per_guard_register_and_views_in_each():
    slots = [BufferSlot("u", 0, (2, 3)), BufferSlot("u", 6, (4,))]
    pools = BufferPools(slots, {"u": 2}, torch.device("cpu"))
    a, b = pools.views(slots[0]), pools.views(slots[1])
    assert len(a) == 2 and a[0].shape == (2, 3) and b[1].shape == (4,)
    bufs = pools.buffers["u"]
    assert bufs[0].numel() == 10 and bufs[0].data_ptr() != bufs[1].data_ptr()
    assert b[1].data_ptr() == bufs[1].data_ptr() + 6 * 4


def _mlp_step(strategy, width: int = 7):
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=5, width=width, hidden=7, n_blocks=2, n_classes=3))
    xs, y = m.example_batch(6)
    comp = compile(m, xs, loss_fn=torch.nn.functional.cross_entropy, target=y,
                   optimizer=SGD(lr=0.1, momentum=0.9), strategy=strategy)
    return comp, m, (*xs, y)


def _packs(plan: ActorPlan) -> dict[int, list[Compute]]:
    return {r: [a for a in rp.actors if isinstance(a, Compute) and a.op == PACK] for r, rp in plan.ranks.items()}


@pytest.mark.parametrize("micro", [1, 2])
def test_flat_buckets_take_every_gradient_in_place_and_regions_copy(micro):
    comp, _, _ = _mlp_step(presets.data_parallel(3, micro_batches=micro))
    plan = comp.plan()
    for r, packs in _packs(plan).items():
        assert packs
        for p in packs:
            assert p.into is not None and p.into.pool == p.name.replace(".pack", ".unpack")
            assert plan.ranks[r].by_name[p.into.pool].registers == 1  # one buffer per bucket, as DDP
            assert all(p.attrs["in_place"])
            for i, ref in enumerate(p.inputs):  # each producer's view: its place in the flat layout
                prod = plan.ranks[r].by_name[ref.actor]
                assert isinstance(prod, Accumulate if micro > 1 else Compute)
                assert prod.into == BufferSlot(p.into.pool, p.attrs["offsets"][i], p.attrs["shapes"][i],
                                               p.into.dtype)
    zero, _, _ = _mlp_step(presets.zero(3))
    for packs in _packs(zero.plan()).values():  # reduce-scatter regions rearrange: pack copies
        assert packs and all(p.into is None and "in_place" not in p.attrs for p in packs)


def test_simulator_prices_a_pack_in_place_as_a_firing_and_a_copy_by_its_bytes():
    comp, _, _ = _mlp_step(presets.data_parallel(2))
    plan = comp.plan()
    actors = plan.ranks[0].actors
    hw = sl.Hardware.cpu_box()
    _, batch, _ = plan_of(comp)
    shapes = infer_rank_shapes(actors, 0, plan.micro_batches, batch)
    pack = next(a for a in actors if isinstance(a, Compute) and a.op == PACK)
    in_place = compute_cost(pack, shapes[pack.name], hw, "cpu")
    assert in_place.seconds == pytest.approx(hw.firing_overhead)
    copying = copy.copy(pack)
    copying.attrs = {**pack.attrs, "in_place": (False,) * len(pack.inputs)}
    cost = compute_cost(copying, shapes[pack.name], hw, "cpu")
    moved = 2 * sum(m.numel * m.dtype.itemsize for m in shapes[pack.name].inputs)
    assert cost.seconds == pytest.approx(hw.firing_overhead + moved / hw.mem_bandwidth)


class _Rewritten:
    """A compiled step whose plan is ``comp``'s with each rank's actors rewritten by ``rewrite``."""

    name = ""

    def __init__(self, comp) -> None:
        self.comp = comp

    def feeds(self, inputs):
        return self.comp.feeds(inputs)

    def rewrite(self, rank: int, rp) -> list:
        raise NotImplementedError

    def plan(self, world_size=None) -> ActorPlan:
        base = self.comp.plan(world_size)
        ranks = {r: self.rewrite(r, rp) for r, rp in base.ranks.items()}
        return ActorPlan.build(base.world_size, ranks, micro_batches=base.micro_batches,
                               device_type=base.device_type, name=self.name)


class _Copying(_Rewritten):
    """Every gradient copied into its bucket (no producer writes in place)."""

    name = "copying"

    def rewrite(self, rank: int, rp) -> list:
        acts = []
        for a in rp.actors:
            a = copy.copy(a)
            if isinstance(a, Compute) and a.op == PACK:
                a.attrs = {**a.attrs, "in_place": (False,) * len(a.inputs)}
            elif getattr(a, "into", None) is not None:
                a.into = None
            acts.append(a)
        return acts


class _Probed(_Rewritten):
    """Also reports, on every rank, where bucket b0's gradients live."""

    name = "probed"

    def rewrite(self, rank: int, rp) -> list:
        pack = rp.by_name["b0.pack"]
        return [*rp.actors,
                Compute("probe", op="bucket_probe:where_grads_live", inputs=(Ref("b0.pack"), *pack.inputs),
                        scope=pack.scope, phase="backward"),
                Sink("probe.sink", inputs=("probe",), key=f"probe{rank}", placement=Placement("cpu", [rank]),
                     sbp=(B,), scope=pack.scope, micro_reduce="last")]


def _torch_losses(m, batch, steps: int) -> list[float]:
    m = copy.deepcopy(m)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    out = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(m(*batch[:-1]), batch[-1])
        o.zero_grad()
        loss.backward()
        o.step()
        out.append(loss.item())
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("micro", [1, 2])
def test_on_workers_gradients_are_views_of_the_reused_bucket_buffer(micro):
    """2 Gloo ranks, 5 steps: every gradient of bucket b0 is its view of the packed buffer, the same
    buffer every step (the unpack keeps one register, as DDP keeps one bucket), and the losses are
    torch's."""
    steps = 5
    comp, m, batch = _mlp_step(presets.data_parallel(2, micro_batches=micro))
    probed = _Probed(comp)
    pack = comp.plan().ranks[0].by_name["b0.pack"]
    with LocalCluster(2) as cluster:
        res = cluster.run(probed, batch, steps=steps, progress=False, trace=False)
        plain = cluster.run(comp, batch, steps=steps, progress=False, trace=False)
        copied = cluster.run(_Copying(comp), batch, steps=steps, progress=False, trace=False)
    assert not any(any(p.attrs["in_place"]) for ps in _packs(_Copying(comp).plan()).values() for p in ps)
    assert plain.losses == copied.losses  # in place or copied: the same bits
    for name, p in plain.params.items():
        assert torch.equal(p.full(), copied.params[name].full()), name
    want = _torch_losses(m, batch, steps)
    assert res.losses == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert plain.losses == pytest.approx(want, rel=1e-5, abs=1e-6)
    n = len(pack.inputs)
    for r in (0, 1):
        rows = [t.reshape(-1) for t in res.outputs[f"probe{r}"]]
        for row in rows:
            assert int(row[1]) == n  # every gradient shares the buffer's storage
            assert tuple(int(o) for o in row[2:]) == pack.attrs["offsets"]  # each at its offset
        assert len({int(row[0]) for row in rows}) == 1  # one buffer, made once, reused every step


@pytest.mark.parametrize("registers", [1, 2])
def test_simulated_memory_holds_the_buffers_for_the_run_and_the_views_as_nothing(registers):
    plan = ActorPlan.build(1, {0: _guarded_plan(registers)})
    pred = sl.simulate(plan, sl.Hardware.cpu_box(), steps=3)
    assert pred.memory_breakdown[0]["gradients"] == registers * 4 * 4  # (4,) float32 per buffer
    plain = _guarded_plan(registers)
    plain[1] = Compute("g", op=K + "noop", inputs=("w",), scope="step", registers=4)
    without = sl.simulate(ActorPlan.build(1, {0: plain}), sl.Hardware.cpu_box(), steps=3)
    assert without.memory_breakdown[0]["gradients"] == 0
