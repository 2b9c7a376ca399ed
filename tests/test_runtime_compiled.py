"""Compiled training steps of the model zoo on 2 and 4 Gloo ranks equal the in-process executor and
single-device PyTorch (torch.optim), step after step."""

from __future__ import annotations

import copy

import pytest
import torch

from sbplab.compiler import SGD, Adam, compile, presets
from sbplab.compiler.lowering.buckets import plan_buckets
from sbplab.models import CNN, GPT, MLP, CNNConfig, GPTConfig, MLPConfig, WideDeep, WideDeepConfig
from sbplab.runtime import Collective, LocalCluster, Recv, Send

pytestmark = pytest.mark.multiprocess
STEPS = 3


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(4) as c:
        yield c


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "mlp":
        m = MLP(MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=1, n_classes=4))
        return m, *m.example_batch(8), torch.nn.functional.cross_entropy
    if kind == "gpt":
        m = GPT(GPTConfig(vocab_size=16, block_size=4, n_layer=1, n_head=2, n_embd=8))
        return m, *m.example_batch(4), GPT.loss_fn
    if kind == "wide_deep":
        m = WideDeep(WideDeepConfig(vocab_size=32, n_fields=2, emb_dim=4, n_dense=3, hidden=8))
        return m, *m.example_batch(8), m.loss_fn
    m = CNN(CNNConfig(in_channels=2, image_size=4, channels=(4, 4), n_classes=3))
    return m, *m.example_batch(8), m.loss_fn


def _torch_reference(model, xs, y, loss_fn, opt: str):
    m = copy.deepcopy(model)
    o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) if opt == "sgd" else \
        torch.optim.Adam(m.parameters(), lr=0.01)
    losses = []
    for _ in range(STEPS):
        loss = loss_fn(m(*xs), y)
        o.zero_grad()
        loss.backward()
        o.step()
        losses.append(loss.item())
    return losses, dict(m.named_parameters())


CASES = [
    ("mlp", "dp2", lambda: presets.data_parallel(2), "sgd"),
    ("mlp", "dp4_micro2", lambda: presets.data_parallel(4, micro_batches=2), "adam"),
    ("mlp", "tp2", lambda: presets.tensor_parallel(2), "sgd"),
    ("mlp", "dp_tp_2x2", lambda: presets.dp_tp((2, 2)), "sgd"),
    ("mlp", "zero3_4", lambda: presets.zero(4), "adam"),
    ("mlp", "pipeline_2x4", lambda: presets.pipeline(2, 4), "sgd"),
    ("mlp", "pipeline_2_tp", lambda: presets.pipeline(2, 2, 2, inner="tp"), "sgd"),
    ("gpt", "dp_tp_2x2", lambda: presets.dp_tp((2, 2)), "sgd"),
    ("gpt", "pipeline_2x2", lambda: presets.pipeline(2, 2), "sgd"),  # Adam would amplify the ~0 k-bias grad
    ("wide_deep", "tp2", lambda: presets.tensor_parallel(2), "sgd"),
    ("cnn", "dp4", lambda: presets.data_parallel(4), "sgd"),
]


@pytest.mark.parametrize("kind,label,strategy,opt", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_compiled_step_on_workers_matches_executor_and_torch(cluster, kind, label, strategy, opt):
    model, xs, y, loss_fn = _model(kind)
    optimizer = SGD(lr=0.1, momentum=0.9) if opt == "sgd" else Adam(lr=0.01)
    comp = compile(model, xs, loss_fn=loss_fn, target=y, optimizer=optimizer, strategy=strategy())
    feeds = dict(zip(comp.graph.inputs, list(xs) + [y]))
    ex = comp.executor()
    ex_losses = [ex.step(feeds) for _ in range(STEPS)]
    plan = comp.plan(world_size=4)
    # a compiled step can be handed to run as it is, with the inputs in graph order; the plan is the same
    res = cluster.run(comp, (*xs, y), steps=STEPS, progress=False) if label in ("dp2", "dp_tp_2x2") else \
        cluster.run(plan, feeds, steps=STEPS, progress=False)
    assert res.losses == pytest.approx(ex_losses, rel=1e-5, abs=1e-6)
    for name, value in ex.params().items():
        assert torch.allclose(res.params[name].full(), value, atol=1e-5), name
    ref_losses, ref_params = _torch_reference(model, xs, y, loss_fn, opt)
    assert res.losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    for name, p in ref_params.items():
        assert torch.allclose(res.params[name].full(), p.detach(), atol=1e-4), name
    # the plan communicates exactly what the physical graph says, parameter gradients in buckets
    colls = {a.name for rp in plan.ranks.values() for a in rp.actors if isinstance(a, Collective)}
    buckets = plan_buckets(comp.physical, comp.graph, comp.strategy.bucket_mb * 2**20)
    bucketed = sum(len(b.collectives) for b in buckets)
    assert len(colls) == len({c.index for c in comp.physical.collectives if c.kind != "send_recv"}) - bucketed \
        + len(buckets)
    if label.startswith(("dp", "zero")):  # every gradient of one group fits one 25 MiB bucket
        assert buckets and bucketed > len(buckets)
    p2p = sum(isinstance(a, (Send, Recv)) for rp in plan.ranks.values() for a in rp.actors)
    assert p2p == 2 * sum(c.kind == "send_recv" for c in comp.physical.collectives)


@pytest.mark.parametrize("strategy", [lambda: presets.pipeline(2, 4), lambda: presets.dp_tp((2, 2))],
                         ids=["pipeline_2x4", "dp_tp_2x2"])
def test_the_compilers_own_collective_order_runs_too(cluster, strategy):
    model, xs, y, loss_fn = _model("mlp")
    comp = compile(model, xs, loss_fn=loss_fn, target=y, optimizer=SGD(lr=0.1), strategy=strategy())
    feeds = dict(zip(comp.graph.inputs, list(xs) + [y]))
    ex = comp.executor()
    ex_losses = [ex.step(feeds) for _ in range(2)]
    plan = comp.plan(world_size=4, order="compiler", registers=1)
    # every rank issues its communication in the physical graph's order, micro-batch by micro-batch
    first = [s for s in plan.comm_order if s.rank == 0][:3]
    assert [s.micro for s in first] == sorted(s.micro for s in first)
    res = cluster.run(plan, feeds, steps=2, progress=False)
    assert res.losses == pytest.approx(ex_losses, rel=1e-5, abs=1e-6)
    for name, value in ex.params().items():
        assert torch.allclose(res.params[name].full(), value, atol=1e-5), name
