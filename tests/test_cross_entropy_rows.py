"""The fused cross entropy (``ops/aten/cross_entropy_rows.py``): torch's loss and torch's gradient bit for
bit, one logits-sized buffer in the backward, and what the capture writes for a plain ``F.cross_entropy``.
Its rule is checked on shards with every corpus op (``tests/test_aten_rules.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sbplab as sl
from sbplab.ops.aten import cross_entropy_rows as ce


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk", [1 << 24, 40])  # the whole at once; 4 rows a chunk
def test_loss_and_gradient_are_torchs(monkeypatch, reduction, chunk):
    monkeypatch.setattr(ce, "CHUNK_ELEMENTS", chunk)
    torch.manual_seed(0)
    x, t = torch.randn(13, 10) * 3, torch.randint(0, 10, (13,))
    t[::4] = -100  # ignored rows
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = F.cross_entropy(a, t, reduction=reduction)
    want.backward()
    rows = ce.cross_entropy_rows(b, t, -100)
    got = rows.sum() / (t != -100).sum() if reduction == "mean" else rows.sum()
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert torch.equal(b.grad, a.grad)  # the gradient is torch's, not only close to it
    assert torch.equal(rows[t == -100], torch.zeros(4))


class _Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 24)

    def forward(self, x, y):
        return F.cross_entropy(self.proj(x), y)


def test_the_capture_writes_the_fused_cross_entropy_and_trains_like_torch():
    """A captured ``F.cross_entropy`` backward makes one (N, C) tensor (torch's decomposed backward makes
    four: zeros, the one-hot scatter, its masked product, the log-softmax's backward), and two data
    parallel ranks train as single-device torch does."""
    torch.manual_seed(0)
    model = _Head()
    x, y = torch.randn(16, 8), torch.randint(0, 24, (16,))
    step = sl.compile(model, {"x": x, "y": y}, optimizer=sl.SGD(lr=0.1), strategy=sl.presets.data_parallel(2),
                      capture="aten")
    g = step.graph
    backward = [op for op in g.ops_in("backward") if "view" not in op.type]
    made = [op.type for op in backward for o in op.outputs if g.tensors[o].shape == (16, 24)]
    assert made == ["sbplab.cross_entropy_rows_backward.default"], made
    ref = _Head()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    with sl.LocalCluster(2) as cluster:
        result = cluster.run(step, {"x": x, "y": y}, steps=2)
    for loss in result.losses:
        opt.zero_grad()
        want = ref(x, y)
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-6)
    for n, p in ref.named_parameters():
        torch.testing.assert_close(result.params[n].full(), p.detach(), rtol=1e-6, atol=1e-7)
