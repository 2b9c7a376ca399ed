"""Where a pipeline is cut, and what crosses the cut: one tensor each way per micro-batch where one suffices.

A residual block cut in the middle sends the branch and the skip; cut at its edge it sends one tensor. A
stage keeps what it received in forward for its backward (nothing is re-sent), and the gradient parts
of a tensor read on the later stage are summed there, so one gradient goes back.
"""

from __future__ import annotations

import copy

import pytest
import torch

import sbplab as sl
from sbplab.models import MLP, MLPConfig


def _mlp(blocks: int):
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=64, width=64, hidden=64, n_blocks=blocks, n_classes=8))
    (x,), y = m.example_batch(16)
    return m, x, y


def _compile(m, x, y, stages: int, micro: int = 2):
    return sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.pipeline(stages, micro))


@pytest.mark.parametrize("blocks,stages", [(1, 2), (3, 2), (3, 4)])
def test_each_cut_sends_one_tensor_forward_and_one_gradient_back(blocks, stages):
    m, x, y = _mlp(blocks)
    c = _compile(m, x, y, stages)
    moves = [col for col in c.physical.collectives if col.kind == "send_recv"]
    forward = [col for col in moves if col.phase == "forward"]
    backward = [col for col in moves if col.phase == "backward"]
    assert len(forward) == len(backward) == stages - 1, [(col.phase, c.physical.nodes[col.nodes[0]].logical)
                                                        for col in moves]
    for col in forward:  # every cut sits at a block's edge: what crosses is the residual stream
        assert c.physical.nodes[col.nodes[0]].logical in {op.outputs[0] for op in c.graph.ops
                                                           if op.phase == "forward" and op.type in ("add", "linear")}


def test_backward_reads_what_forward_received_instead_of_a_second_send():
    m, x, y = _mlp(1)
    c = _compile(m, x, y, 2)
    backward_moves = {c.physical.nodes[col.nodes[0]].logical for col in c.physical.collectives
                      if col.kind == "send_recv" and col.phase == "backward"}
    forward_made = {o for op in c.graph.ops if op.phase == "forward" for o in op.outputs}
    assert not backward_moves & forward_made


@pytest.mark.multiprocess
def test_cut_pipelines_train_like_torch():
    m, x, y = _mlp(3)
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        loss = m.loss_fn(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    c = _compile(m, x, y, 4, micro=4)
    with sl.LocalCluster(4) as cluster:
        res = cluster.run(c, (x, y), steps=3, progress=False)
    assert res.losses == pytest.approx(losses, rel=1e-4, abs=1e-5)
    for name, p in ref.named_parameters():
        assert torch.allclose(res.params[name].full(), p.detach(), atol=1e-4), name
