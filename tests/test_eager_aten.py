"""A lone eager op and the same op compiled agree: both are the ATen op torch's own capture records,
decided by one family rule (``sbplab/ops/aten/rules.py``) and one chooser.

For each case the torch call is captured by ``capture_aten`` (torch.export and the joint graph), and
the eager method on global tensors is run: the eager op is the captured forward op (same overload),
the signature eager picks equals the one the compiler deduces for a graph holding the captured op
with its inputs pinned to the same SBPs, and the eager value equals torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import sbplab as sl
from sbplab.compiler import GraphBuilder, Strategy, deduce
from sbplab.compiler.frontend.aten_capture import capture_aten
from sbplab.sbp import B, P, S

LINE = sl.Placement("cpu", [0, 1])
HW = sl.Hardware.cpu_box()


class _Call(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs).sum()


def _gen(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


# (name, torch function of the inputs, inputs, input SBPs to try)
CASES = [
    ("mm", lambda x, w: x @ w, [_gen(8, 6), _gen(6, 4)], [(S(0), B), (S(1), S(0)), (B, S(1)), (P, B)]),
    ("add", lambda x, b: x + b, [_gen(8, 6), _gen(6)], [(S(0), B), (S(1), S(0)), (P, P)]),
    ("div", lambda x, y: x / y, [_gen(8, 6), _gen(8, 6).exp()], [(P, B), (S(1), S(1))]),
    ("relu", lambda x: x.relu(), [_gen(8, 6)], [(S(1),), (P,), (sl.P("max"),)]),
    ("softmax", lambda x: x.softmax(-1), [_gen(8, 6)], [(S(0),), (S(1),)]),
    ("log_softmax", lambda x: x.log_softmax(0), [_gen(8, 6)], [(S(1),), (P,)]),
    ("sum", lambda x: x.sum(1), [_gen(4, 6, 8)], [(S(1),), (S(2),), (P,)]),
    ("amax", lambda x: x.max(1), [_gen(4, 6, 8)], [(S(1),), (S(0),)]),
    ("transpose", lambda x: x.transpose(0, 2), [_gen(4, 6, 8)], [(S(0),), (P,)]),
    ("view", lambda x: x.reshape(4, 48), [_gen(4, 6, 8)], [(S(0),), (S(1),)]),
]


def _captured_op(fn, inputs):
    """The forward op the capture records for ``fn`` (the one before the loss's sum)."""
    g, _ = capture_aten(_Call(fn), tuple(inputs), {})
    fwd = [op for op in g.ops if op.phase == "forward" and op.type.startswith("aten.")]
    return fwd[-2]


def _torch_value(fn, inputs):
    out = fn(*inputs)
    return out.values if hasattr(out, "values") and not isinstance(out, torch.Tensor) else out


@pytest.mark.parametrize("name,fn,inputs,sbps", CASES, ids=[c[0] for c in CASES])
def test_eager_op_is_the_captured_op_with_the_compiled_choice(name, fn, inputs, sbps):
    op = _captured_op(lambda *xs: fn(*xs) if name != "amax" else torch.amax(xs[0], 1), inputs)
    assert op.type.split(".")[1] in (name, "_" + name, "amax")
    for one in sbps:
        xs = [sl.tensor(t, LINE, (s,), name=f"x{i}") for i, (t, s) in enumerate(zip(inputs, one))]
        y = fn(*xs)
        assert y.record.op.endswith(f"[{op.type}]"), (y.record.op, op.type)
        gb = GraphBuilder()
        gx = [gb.input(f"x{i}", tuple(t.shape), t.dtype) for i, t in enumerate(inputs)]
        out = gb.op(op.type, *gx, name="the_op", **op.attrs)
        g = gb.build(outputs=[out if not isinstance(out, tuple) else out[0]])
        st = Strategy(LINE)
        for i, s in enumerate(one):
            st.hint(f"x{i}", (s,), why="the case under test")
        choice = deduce(g, st, HW).choices["the_op"]
        assert y.record.chosen.signature == choice.signature, (name, one)
        torch.testing.assert_close(y.full(), _torch_value(fn, inputs), atol=1e-5, rtol=1e-5)
