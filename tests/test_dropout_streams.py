"""Dropout with p > 0 on real workers: each random op draws from a stream of its own over the global
tensor (``ops/aten/family_random.py``), so data parallel, tensor parallel and a 2-stage pipeline with
micro-batches all train exactly like single-device torch whose ``F.dropout`` draws from the same
streams (``same_masks``), seeds fixed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sbplab as sl
from sbplab.models.corpus import Built
from sbplab.ops.aten.family_random import same_masks

LR = 0.1


class Block(nn.Module):
    """A transformer MLP block with dropout on the hidden features (split under tensor parallel) and on
    the block's output (replicated under tensor parallel)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.drop_hidden, self.drop_out = nn.Dropout(0.1), nn.Dropout(0.1)

    def forward(self, x):  # (B, T, C)
        return x + self.drop_out(self.fc2(self.drop_hidden(F.gelu(self.fc1(x)))))


class Net(nn.Module):
    def __init__(self, c: int = 16, classes: int = 5) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(c), Block(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x):  # (B, T, C) -> (B, T, classes)
        return self.head(self.blocks(x))


def _loss(out, target):
    return F.cross_entropy(out.flatten(0, 1), target.flatten())


def _built() -> Built:
    torch.manual_seed(0)
    model = Net().train()
    x, y = torch.randn(8, 4, 16), torch.randint(0, 5, (8, 4))
    return Built("dropout-mlp", model, (x,), _loss, y)


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


STRATEGIES = {
    "dp": lambda: sl.presets.data_parallel(2),
    "tp": lambda: sl.presets.tensor_parallel(2),
    "pipeline": lambda: sl.presets.pipeline(2, 2),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_dropout_trains_like_torch_with_the_same_masks(cluster, strategy):
    built = _built()
    st = STRATEGIES[strategy]()
    torch.manual_seed(1234)  # the streams' seed: torch.initial_seed() when the step compiles
    step = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                      optimizer=sl.SGD(lr=LR), strategy=st)
    streams = [op.attrs["stream"] for op in step.graph.ops if "stream" in op.attrs]
    assert len(streams) == 4 and {s[0] for s in streams} == {1234}
    result = cluster.run(step, built.feeds(), steps=3)
    with same_masks(step.graph):
        want, trained = built.train_torch(3, lambda ps: torch.optim.SGD(ps, lr=LR), st.micro_batches)
    assert result.losses == pytest.approx(want, abs=2e-5), (result.losses, want)
    got = result.full_params()
    for fqn, p in trained.named_parameters():
        torch.testing.assert_close(got[fqn], p.detach(), atol=2e-5, rtol=1e-4, msg=lambda m, fqn=fqn: f"{fqn}: {m}")
    # the masks matter: torch with other masks (its own generator) does not give these losses
    torch.manual_seed(1234)
    other, _ = built.train_torch(3, lambda ps: torch.optim.SGD(ps, lr=LR), st.micro_batches)
    assert other != pytest.approx(want, abs=1e-4)
