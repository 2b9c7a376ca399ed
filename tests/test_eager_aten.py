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
import torch.nn.functional as F

import sbplab as sl
from sbplab.compiler import GraphBuilder, Strategy, deduce
from sbplab.compiler.frontend.aten_capture import capture_aten
from sbplab.eager import OpRecord
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


# --- every other name sl.apply takes: the torch function, traced -----------------------------------------
MESH = sl.Placement("cpu", [[0, 1], [2, 3]])


def _ids(*shape, high=6):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(sum(shape)))


# (name, attrs, torch function of the inputs, inputs, input SBPs to try on a 2x2 mesh)
NAMED = [
    ("linear", {}, lambda x, w, b: F.linear(x, w, b), [_gen(8, 6), _gen(4, 6), _gen(4)],
     [((S(0), B), (B, S(0)), (B, S(0))), ((S(1), B), (S(1), B), (P, B))]),
    ("linear", {}, lambda x, w: F.linear(x, w), [_gen(2, 4, 6), _gen(4, 6)],  # 3-D: view, t, mm, view
     [((S(0), S(1)), (B, S(0))), ((B, S(2)), (S(1), B))]),
    ("layer_norm", {"normalized_shape": (6,)}, lambda x, w, b: F.layer_norm(x, (6,), w, b),
     [_gen(8, 6), _gen(6), _gen(6)], [((S(0), B), (B, B), (B, B)), ((S(1), S(0)), (P, B), (P, B))]),
    ("embedding", {}, F.embedding, [_ids(8, 4), _gen(6, 4)], [((S(0), B), (B, S(1))), ((B, B), (S(0), B))]),
    ("gather", {"dim": 1}, lambda x, i: torch.gather(x, 1, i), [_gen(8, 6), _ids(8, 3)],
     [((S(0), B), (S(0), B)), ((P, S(1)), (B, B))]),
    ("concat", {"dim": 1}, lambda a, b: torch.cat([a, b], 1), [_gen(8, 6), _gen(8, 2)],
     [((S(0), B), (S(0), B)), ((S(1), P), (B, P))]),
    ("conv2d", {"padding": 1}, lambda x, w: F.conv2d(x, w, padding=1), [_gen(2, 3, 4, 4), _gen(4, 3, 3, 3)],
     [((S(0), B), (B, B)), ((S(1), B), (S(1), S(0)))]),
    ("cross_entropy", {}, F.cross_entropy, [_gen(8, 6), _ids(8)], [((S(0), B), (S(0), B)), ((S(1), B), (B, B))]),
    ("min", {"dim": 1}, lambda x: torch.amin(x, 1), [_gen(8, 6)], [((S(1), S(0)),), ((sl.P("min"), B),)]),
    ("scale", {"factor": 0.5}, lambda x: x * 0.5, [_gen(8, 6)], [((P, S(1)),)]),
    ("add_scalar", {"value": 0.5}, lambda x: x + 0.5, [_gen(8, 6)], [((S(0), S(1)),), ((P, B),)]),
    ("view", {"shape": (48,)}, lambda x: x.reshape(48), [_gen(8, 6)], [((S(0), B),)]),
    # the global tensor's methods the ten cases above leave out
    ("sub", {}, lambda a, b: a - b, [_gen(8, 6), _gen(6)], [((P, S(1)), (P, S(0)))]),
    ("mul", {}, lambda a, b: a * b, [_gen(8, 6), _gen(8, 6)], [((P, B), (B, S(1)))]),
    ("neg", {}, lambda x: -x, [_gen(8, 6)], [((sl.P("max"), S(1)),)]),
    ("tanh", {}, torch.tanh, [_gen(8, 6)], [((S(1), P),)]),
    ("exp", {}, torch.exp, [_gen(8, 6)], [((S(0), S(1)),)]),
    ("gelu", {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"), [_gen(8, 6)], [((P, S(0)),)]),
    ("mean", {"dims": (1,)}, lambda x: x.mean(1), [_gen(8, 6)], [((S(1), S(0)),), ((P, B),)]),  # sum, div
    ("permute", {"dims": (2, 0, 1)}, lambda x: x.permute(2, 0, 1), [_gen(2, 4, 6)], [((S(2), P),)]),
    ("slice", {"dim": 1, "start": 1, "stop": 5, "step": 2}, lambda x: x[:, 1:5:2], [_gen(8, 6)],
     [((S(0), S(1)),)]),
    ("matmul", {}, lambda x, w: x @ w, [_gen(2, 4, 6), _gen(6, 3)],  # view, mm, _unsafe_view
     [((S(0), B), (B, S(1))), ((S(2), B), (S(0), B))]),
    ("max", {"dim": 0}, lambda x: torch.amax(x, 0), [_gen(8, 6)], [((S(0), P),)]),
]


class _Sum(nn.Module):
    """The function's output summed, so the capture has a loss; inputs are plain inputs, not parameters."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs).float().sum()


@pytest.mark.parametrize("name,attrs,fn,inputs,sbps", NAMED, ids=[f"{c[0]}-{len(c[3][0].shape)}d" for c in NAMED])
def test_every_named_eager_op_runs_the_captured_ops_with_the_compiled_choices(name, attrs, fn, inputs, sbps):
    """Every name ``sl.apply`` takes but sbplab's optimizer updates (those are sbplab ops in a compiled step
    too, one rule): ``sl.apply(name, ...)`` runs the forward ATen ops the capture records for the torch function (same
    overloads, in order); each of them picks, for the SBPs its inputs arrive in, the signature the compiler
    deduces for a graph of that op alone; the value equals torch."""
    g, _ = capture_aten(_Sum(fn), tuple(inputs), {})
    captured = [op for op in g.ops if op.phase == "forward" and op.type.startswith(("aten.", "sbplab."))][:-1]  # less the sum
    assert captured, name
    for one in sbps:
        xs = [sl.tensor(t, MESH, s, name=f"x{i}") for i, (t, s) in enumerate(zip(inputs, one))]
        with sl.explain_log() as log:
            y = sl.apply(name, xs, **attrs)
        records = [r for r in log.records if isinstance(r, OpRecord)]
        assert [r.op.split("[")[-1].rstrip("]") for r in records] == [op.type for op in captured], (name, one)
        for rec, op in zip(records, captured):
            gb = GraphBuilder()
            gx = [gb.input(f"x{i}", tuple(g.tensors[t].meta.shape), g.tensors[t].meta.dtype)
                  for i, t in enumerate(op.inputs)]
            out = gb.op(op.type, *gx, name="the_op", **op.attrs)
            st = Strategy(MESH)
            for i, s in enumerate(rec.input_sbps):
                st.hint(f"x{i}", s, why="the SBPs the eager step's inputs arrived in")
            graph = gb.build(outputs=[out if not isinstance(out, tuple) else out[0]])
            assert rec.chosen.signature == deduce(graph, st, HW).choices["the_op"].signature, (name, one, op.type)
        torch.testing.assert_close(y.full(), fn(*inputs), atol=1e-5, rtol=1e-5)
