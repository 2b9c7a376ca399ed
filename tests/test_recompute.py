"""Activation recomputation executed: ``Strategy(recompute="full" | "selective")`` clones forward ops
into the backward (each layer, or each attention core), the backward reads the clones, the saved
activations die after the forward (the compiled liveness peak and the peak the workers measure
drop), the workers really fire the clones during the backward, and training equals plain torch (recomputation changes no value:
torch.utils.checkpoint gives the values of a run without it).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import sbplab as sl
from sbplab.compiler.reference import torch_steps
from sbplab.compiler.training.recompute import SUFFIX, activation_peak, layer_of

STEPS = 2


def _gpt():
    torch.manual_seed(0)
    model = sl.models.GPT(sl.models.GPTConfig(n_layer=2))
    (idx,), targets = model.example_batch(8)
    return model, idx, targets


def _compile(strategy, recompute, capture="auto"):
    model, idx, targets = _gpt()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
        return sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets, optimizer=sl.SGD(lr=0.1),
                          strategy=dataclasses.replace(strategy, recompute=recompute), capture=capture)


@pytest.fixture(scope="module")
def dp_steps():
    return {rc: _compile(sl.presets.data_parallel(2), rc) for rc in ("none", "full", "selective")}


def _clones(step):
    return [op for op in step.graph.ops if op.name.endswith(SUFFIX)]


def test_the_backward_reads_recomputed_forward_ops(dp_steps):
    plain = dp_steps["none"]
    assert not _clones(plain) and plain.recompute is None
    for mode in ("full", "selective"):
        step = dp_steps[mode]
        g = step.graph
        clones = _clones(step)
        assert clones and len(clones) == step.recompute.cloned, mode
        for op in clones:
            orig = g.op_by_name[op.forward_op]
            assert op.phase == "backward" and orig.phase == "forward" and op.type == orig.type
        for t in step.recompute.freed:  # a freed activation is read by forward ops only
            assert all(c.phase == "forward" for c in g.consumers(t)), t
        # every backward op that read a freed tensor now reads its clone
        assert all(t + SUFFIX in g.tensors for t in step.recompute.freed)
    full, sel = dp_steps["full"], dp_steps["selective"]
    assert set(full.recompute.regions) == {"blocks.0", "blocks.1"}  # one region per layer
    assert all(layer_of(g) for op in _clones(full) for g in [op.module])
    # selective: only the attention core (scores, softmax, the value matmul), never a projection or the MLP
    assert {op.type for op in _clones(sel)} <= {"matmul", "scale", "add", "softmax"}
    assert "softmax" in {op.type for op in _clones(sel)} and len(_clones(sel)) < len(_clones(full))


def test_the_activation_peak_drops(dp_steps):
    """The compiled liveness (per rank, and the logical graph's) is lower with recomputation: full
    keeps only each layer's input, selective drops the (B, H, T, T) tensors."""
    peak = {rc: s.memory.ranks[0].activations_peak for rc, s in dp_steps.items()}
    assert peak["full"] < peak["selective"] < peak["none"], peak
    logical = {rc: activation_peak(s.graph) for rc, s in dp_steps.items()}
    assert logical["full"] < logical["selective"] < logical["none"], logical


@pytest.mark.multiprocess
def test_workers_recompute_in_the_backward_and_train_like_torch(dp_steps):
    model, idx, targets = _gpt()
    want, want_params = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS)
    tp_full = _compile(sl.presets.tensor_parallel(2), "full", capture="aten")
    assert _clones(tp_full)
    measured = {}  # the peak bytes each rank's runtime held (RunResult.memory)
    with sl.LocalCluster(2) as cluster:
        for step in (dp_steps["none"], dp_steps["full"], dp_steps["selective"], tp_full):
            result = cluster.run(step, (idx, targets), steps=STEPS, progress=False)
            if step is not tp_full:
                measured[step.strategy.recompute] = max(m.peak for m in result.memory.values())
            if step.strategy.recompute == "none":
                continue
            assert result.losses == pytest.approx(want, rel=1e-5), step.strategy
            for name, p in want_params.items():
                assert torch.allclose(result.params[name].full(), p, atol=1e-5), name
            logical = {f"n{n.id}": n.logical for n in step.physical.nodes}  # actor -> the op it runs
            for rank in (0, 1):
                events = [e for e in result.trace.select(rank=rank, lane="compute") if e.step == 0]
                again = [e for e in events if logical.get(e.actor, "").endswith(SUFFIX)]
                forward = [e for e in events if e.phase == "forward" and e.kind == "compute"]
                assert again, (step.strategy, rank)  # the clones fired
                # ... after the forward: recomputed in the backward, not kept from the forward
                assert min(e.start for e in again) >= max(e.end for e in forward) - 1e-3
    assert measured["full"] < measured["selective"] < measured["none"], measured


def test_training_options_list_what_changes_something(dp_steps):
    from sbplab.compiler.training.options import training_options, with_options

    gpt = training_options(dp_steps["none"].graph)
    assert ("full" in {m for _, m in gpt}) and ("selective" in {m for _, m in gpt})
    assert gpt[0] == (sl.Precision(), "none") and {p for p, _ in gpt} == {sl.Precision(), sl.Precision.mixed()}
    torch.manual_seed(0)
    mlp = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=16, n_blocks=2, n_classes=4))
    (x,), y = mlp.example_batch(8)
    g = sl.compile(mlp, (x,), loss_fn=mlp.loss_fn, target=y).graph
    assert {m for _, m in training_options(g)} == {"none", "full"}  # blocks, but no attention
    s = with_options(sl.presets.data_parallel(2), sl.Precision.mixed(), "full")
    assert s.recompute == "full" and s.precision.compute == "bf16" and "bf16" in s.name and "full" in s.name
