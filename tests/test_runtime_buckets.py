"""Gradient buckets: parameter-gradient reductions of one group run as one collective over a flat buffer.

Checked: the pack/unpack layout against each gradient's own reduction (uneven pieces included), how
buckets are cut (cap, production order, parameter gradients only), and real runs on Gloo workers
that train exactly like single-device torch while issuing one collective per bucket.
"""

from __future__ import annotations

import copy

import pytest
import torch

import sbplab as sl
from sbplab.boxing.bucket_kernels import pack_bucket, unpack_bucket
from sbplab.compiler import SGD, compile, presets
from sbplab.compiler.lowering.buckets import plan_buckets
from sbplab.layout import balanced_sizes
from sbplab.models import MLP, MLPConfig
from sbplab.runtime import Collective, LocalCluster

STEPS = 3


def _grads(p: int) -> list[list[torch.Tensor]]:
    """Per rank, partial gradients of four uneven shapes."""
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (3,), (5, 7), (11,)]
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(p)]


def test_flat_bucket_equals_each_gradients_all_reduce():
    parts = _grads(3)
    shapes = tuple(tuple(x.shape) for x in parts[0])
    total = sum(pack_bucket(xs, {})[0] for xs in parts)  # what an all-reduce(sum) leaves on every rank
    views = unpack_bucket([total], {"shapes": shapes})
    for i, v in enumerate(views):
        assert torch.allclose(v, sum(xs[i] for xs in parts))
        assert v.shape == shapes[i]


def test_region_bucket_equals_each_gradients_reduce_scatter_with_uneven_pieces():
    p = 3
    parts = _grads(p)
    dims = (0, 0, 1, 0)
    sizes = tuple(tuple(balanced_sizes(x.shape[d], p)) for x, d in zip(parts[0], dims))  # e.g. 7 -> (3, 2, 2)
    region = max(sum(x.numel() // x.shape[d] * s[j] for x, d, s in zip(parts[0], dims, sizes)) for j in range(p))
    attrs = {"dims": dims, "sizes": sizes, "region": region}
    total = sum(pack_bucket(xs, attrs)[0] for xs in parts)
    assert total.shape == (p * region,)
    for me in range(p):  # a reduce-scatter over dim 0 leaves region ``me`` on rank ``me``
        mine = total[me * region:(me + 1) * region]
        want = [sum(xs[i] for xs in parts).narrow(d, sum(s[:me]), s[me]) for i, (d, s) in enumerate(zip(dims, sizes))]
        got = unpack_bucket([mine], {"shapes": tuple(tuple(w.shape) for w in want)})
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def _mlp(width: int = 8):
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=5, width=width, hidden=7, n_blocks=2, n_classes=3))
    return m, *m.example_batch(6)


def _compile(strategy, bucket_mb: float, width: int = 8):
    m, xs, y = _mlp(width)
    strategy.bucket_mb = bucket_mb
    return compile(m, xs, loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=SGD(lr=0.1, momentum=0.9),
                   strategy=strategy)


def test_buckets_take_gradients_in_production_order_up_to_the_cap():
    comp = _compile(presets.data_parallel(2), bucket_mb=0)
    grads = set(comp.graph.grads.values())
    reductions = [c for c in comp.physical.collectives if comp.physical.nodes[c.nodes[0]].logical in grads]
    assert len(reductions) == len(comp.graph.params)
    sizes = {c.index: comp.physical.nodes[c.nodes[0]].in_shapes[0] for c in reductions}
    cap = 200 * 4  # bytes: a few gradients of this model each
    buckets = plan_buckets(comp.physical, comp.graph, cap)
    assert 1 < len(buckets) < len(reductions)
    members = [i for b in buckets for i in b.collectives]
    assert members == sorted(members)  # production order, buckets one after another
    order = [c.index for c in reductions]
    nbytes = {i: torch.Size(s).numel() * 4 for i, s in sizes.items()}
    for b in buckets:  # a bucket stays within the cap, and the next gradient would have overflowed it
        total = sum(nbytes[i] for i in b.collectives)
        assert total <= cap
        after = order.index(b.collectives[-1]) + 1
        if after < len(order):
            assert total + nbytes[order[after]] > cap
    assert set(members) <= set(sizes)
    assert plan_buckets(comp.physical, comp.graph, 0) == []


def test_activation_gradient_reductions_are_never_bucketed():
    """Megatron's backward all-reduce of an activation gradient is on the critical path: alone, always."""
    comp = _compile(presets.tensor_parallel(2), bucket_mb=25)
    grads = set(comp.graph.grads.values())
    acts = [c for c in comp.physical.collectives if comp.physical.nodes[c.nodes[0]].logical not in grads]
    assert acts
    bucketed = {i for b in plan_buckets(comp.physical, comp.graph, 25 * 2**20) for i in b.collectives}
    assert not bucketed & {c.index for c in acts}


def test_bucket_mb_must_not_be_negative():
    with pytest.raises(sl.SbplabError, match="bucket_mb must be >= 0"):
        sl.Strategy(presets.data_parallel(2).placement, bucket_mb=-1)


def test_buckets_cut_latency_in_the_simulator():
    """Twelve gradients in one all-reduce pay one latency instead of twelve."""
    hw = sl.Hardware.h100_node()
    one = sl.simulate(_compile(presets.data_parallel(2), bucket_mb=25), hw)
    each = sl.simulate(_compile(presets.data_parallel(2), bucket_mb=0), hw)
    assert one.step_time < each.step_time


def _torch_reference(width: int):
    m, xs, y = _mlp(width)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        loss = torch.nn.functional.cross_entropy(m(*xs), y)
        o.zero_grad()
        loss.backward()
        o.step()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in m.named_parameters()}, (*xs, y)


@pytest.mark.multiprocess
@pytest.mark.parametrize("label", ["dp3", "zero3_3", "dp3_micro2", "dp3_small_buckets"])
def test_bucketed_runs_train_like_torch_with_one_collective_per_bucket(label):
    """3 ranks: widths 7 and 8 split unevenly, so the ZeRO reduce-scatter regions are padded."""
    strategy, mb = {"dp3": (presets.data_parallel(3), 25), "zero3_3": (presets.zero(3), 25),
                    "dp3_micro2": (presets.data_parallel(3, micro_batches=2), 25),
                    "dp3_small_buckets": (presets.data_parallel(3), 200 * 4 / 2**20)}[label]
    width = 7
    comp = _compile(copy.copy(strategy), mb, width)
    ref_losses, ref_params, batch = _torch_reference(width)
    plan = comp.plan()
    buckets = plan_buckets(comp.physical, comp.graph, comp.strategy.bucket_mb * 2**20)
    assert buckets
    with LocalCluster(3) as cluster:
        res = cluster.run(comp, batch, steps=STEPS, progress=False)
    assert res.losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    for name, p in ref_params.items():
        assert torch.allclose(res.params[name].full(), p, atol=1e-4), name
    colls = {(r, a.name): a for r, rp in plan.ranks.items() for a in rp.actors if isinstance(a, Collective)}
    bucket_names = {f"b{b.index}" for b in buckets}
    events = [e for e in res.trace.events if (e.rank, e.actor) in colls]
    fired = {e.actor for e in events}
    assert bucket_names <= fired
    for e in events:  # the trace's bytes are the bucket's, as the plan said
        assert e.bytes == colls[(e.rank, e.actor)].bytes_sent
    per_step = [e for e in events if e.rank == 0 and e.step == 1 and e.actor in bucket_names]
    assert len(per_step) == len(buckets)  # one collective per bucket per step, not one per gradient
    if label == "dp3_small_buckets":  # the first bucket goes out while backward still computes
        first = min((e for e in events if e.rank == 0 and e.step == 1 and e.actor == "b0"), key=lambda e: e.start)
        backward = [e for e in res.trace.events if e.rank == 0 and e.step == 1 and e.phase == "backward"
                    and e.lane == "compute"]
        assert first.start < max(e.end for e in backward)
