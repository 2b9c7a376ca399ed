"""A lone op picks the same signature eagerly and in a compiled graph: one chooser, one rule.

The compiled side is a forward graph holding only that op (no loss, no downstream demand), its inputs
pinned to the SBPs under test by store hints, deduced directly. The eager side is the user's path
(``sl.apply`` on global tensors). Both must choose the same signature and list the same runners-up,
and the eager result must equal plain torch.
"""

from __future__ import annotations

import itertools
import random
import zlib

import pytest
import torch

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.compiler import GraphBuilder, HintError, SignatureError, Strategy, deduce
from sbplab.compiler import parse_signature as compiler_parse_signature
from sbplab.eager.aten_eager import renumber, steps_of
from sbplab.eager.torch_calls import TORCH_CALLS, traced_steps
from sbplab.ops.choose import BoxingCost, RankedSignature, rank_signatures
from sbplab.ops.registry import TensorMeta, nd_signatures
from sbplab.ops.signature_text import parse_signature
from sbplab.sbp import B, P, S, fmt_sbp

MESH = sl.Placement("cpu", [[0, 1], [2, 3]])
HW = sl.Hardware.cpu_box()  # eager's default hardware; the compiled side is given the same
ONE_AXIS = (B, P, S(0), S(1))
ALL_2D = list(itertools.product(ONE_AXIS, ONE_AXIS))  # the 16 n-D SBPs of a matrix on a 2x2 mesh


def _compiled(op: str, inputs: list[torch.Tensor], sbps: list[tuple], attrs: dict):
    """Deduce a graph holding only ``op``, its inputs stored as ``sbps``; (choice, deduction)."""
    gb = GraphBuilder()
    xs = [gb.input(f"x{i}", tuple(t.shape), t.dtype) for i, t in enumerate(inputs)]
    metas = [TensorMeta.of(t) for t in inputs]
    steps = steps_of(op, metas, attrs)  # a tensor method runs as its ATen op
    if steps is None and op in TORCH_CALLS:  # a torch function: the ATen op torch runs for it
        steps = list(traced_steps(op, metas, attrs).steps)
    if steps is not None:
        (step,) = steps
        order: list[int] = []
        call = {"args": renumber(step.args, order), "kwargs": renumber(step.kwargs, order)}
        y = gb.op(step.op, *[xs[i] for i in order], name="the_op", **call)
    else:
        y = gb.op(op, *xs, name="the_op", **attrs)
    g = gb.build(outputs=[y if not isinstance(y, tuple) else y[0]])
    st = Strategy(MESH)
    for i, nd in enumerate(sbps):
        st.hint(f"x{i}", nd, why="the case under test")
    d = deduce(g, st, HW)
    return d.choices["the_op"], d


def _eager(op: str, inputs: list[torch.Tensor], sbps: list[tuple], attrs: dict):
    xs = [sl.tensor(t, MESH, nd, name=f"x{i}") for i, (t, nd) in enumerate(zip(inputs, sbps))]
    return sl.apply(op, xs, **attrs)


def _assert_same_choice(op, inputs, sbps, attrs) -> sl.GlobalTensor:
    y = _eager(op, inputs, sbps, attrs)
    choice, d = _compiled(op, inputs, sbps, attrs)
    case = f"{op} with inputs {', '.join(fmt_sbp(s) for s in sbps)}"
    assert y.record.chosen.signature == choice.signature, case
    # the runners-up agree too, in order and at the same price in bytes
    assert [(c.signature, c.boxing_bytes) for c in y.record.rejected[:3]] == choice.rejected, case
    assert y.record.chosen.boxing_bytes == choice.cost, case
    return y


# --- matmul: every pair of input SBPs -----------------------------------------------------------------
@pytest.mark.parametrize("x_sbp", ALL_2D, ids=lambda s: f"x{s}")
def test_matmul_picks_the_same_signature_eagerly_and_compiled_for_every_input_pair(x_sbp):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 8, generator=gen), torch.randn(8, 8, generator=gen)
    for w_sbp in ALL_2D:
        y = _assert_same_choice("matmul", [x, w], [x_sbp, w_sbp], {})
        if w_sbp in ((B, B), (S(0), P), (P, S(1))):  # a few full numeric checks per row
            assert torch.allclose(y.full(), x @ w, atol=1e-5), (x_sbp, w_sbp)


def test_matmul_keeps_its_inputs_where_a_signature_accepts_them():
    """OneFlow's rule falls out of the cost: a signature that reads the inputs as they are costs
    nothing, so it wins, eagerly and compiled alike."""
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    for x_sbp, w_sbp in [((S(0), B), (B, S(1))), ((S(1), B), (S(0), B)), ((B, P), (B, B))]:
        y = _assert_same_choice("matmul", [x, w], [x_sbp, w_sbp], {})
        assert y.record.chosen.signature.inputs == (x_sbp, w_sbp)
        assert y.record.boxings == [] and y.record.chosen.boxing_steps == 0
        choice, _ = _compiled("matmul", [x, w], [x_sbp, w_sbp], {})
        assert choice.reason.startswith("keeps every input's SBP") and choice.reads == [None, None]


# --- other ops over random input SBPs ----------------------------------------------------------------
def _random_sbp(rng: random.Random, ndim: int, partial: bool = True) -> tuple:
    one = [B, *(S(d) for d in range(ndim))] + ([P] if partial else [])
    return (rng.choice(one), rng.choice(one))


def _cases():
    gen = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return [
        ("add", [r(8, 8), r(8)], {}),  # broadcasting: the bias has one dim
        ("relu", [r(8, 8)], {}),
        ("softmax", [r(8, 8)], {"dim": 1}),
        ("layer_norm", [r(8, 8), r(8), r(8)], {"normalized_shape": (8,)}),
        ("sum", [r(8, 4, 8)], {"dims": (1,)}),
        ("embedding", [torch.randint(0, 8, (8, 4), generator=gen), r(8, 8)], {}),
        ("transpose", [r(8, 4, 8)], {"dim0": 0, "dim1": 2}),
    ]


def _reference(op: str, inputs: list[torch.Tensor], attrs: dict) -> torch.Tensor:
    x = inputs[0]
    return {
        "add": lambda: x + inputs[1],
        "relu": lambda: torch.relu(x),
        "softmax": lambda: torch.softmax(x, dim=attrs.get("dim", -1)),
        "layer_norm": lambda: torch.nn.functional.layer_norm(x, (8,), inputs[1], inputs[2]),
        "sum": lambda: x.sum(dim=1),
        "embedding": lambda: torch.nn.functional.embedding(x, inputs[1]),
        "transpose": lambda: x.transpose(0, 2),
    }[op]()


@pytest.mark.parametrize("op,inputs,attrs", _cases(), ids=[c[0] for c in _cases()])
def test_other_ops_pick_the_same_signature_over_random_input_sbps(op, inputs, attrs):
    rng = random.Random(zlib.crc32(op.encode()))
    for k in range(12):
        sbps = [_random_sbp(rng, t.ndim, partial=t.is_floating_point()) for t in inputs]
        y = _assert_same_choice(op, inputs, sbps, attrs)
        if k < 3:  # the eager result is the single-device torch result
            assert torch.allclose(y.full(), _reference(op, inputs, attrs), atol=1e-5), (op, sbps)


# --- the chooser itself ------------------------------------------------------------------------------
def test_cost_rule_prefers_time_then_bytes_then_steps_then_per_rank_flops():
    """All-B inputs: the all-B signature needs nothing and wins; every other signature needs at least
    a local slice (time 0, bytes 0, one step), and among those the ones splitting more work first."""
    metas = [TensorMeta((8, 8)), TensorMeta((8, 8))]
    have = [(B, B), (B, B)]
    ranked = rank_signatures("matmul", metas, {}, MESH, have,
                             lambda i, w: BoxingCost.of(plan_boxing((8, 8), have[i], w, MESH, hardware=HW)))
    assert len(ranked) == len(nd_signatures("matmul", metas, {}, MESH))
    assert [c.cost_key() for c in ranked] == sorted(c.cost_key() for c in ranked)
    first, second = ranked[0], ranked[1]
    assert first.signature.inputs == ((B, B), (B, B)) and first.boxing_steps == 0 and first.keeps_inputs
    assert second.boxing_bytes == 0 and second.boxing_steps >= 1 and second.local_flops < first.local_flops
    # an extra term (what the compiler knows downstream) is added to the same cost
    extra = BoxingCost(1.0, 10, 1)
    with_extra = rank_signatures("matmul", metas, {}, MESH, have, lambda i, w: BoxingCost(),
                                 extra=lambda s: extra if s.outputs[0] == (B, B) else BoxingCost())
    assert with_extra[-1].signature.outputs[0] == (B, B) and with_extra[-1].extra == extra
    assert isinstance(with_extra[0], RankedSignature)


def test_one_signature_error_and_one_parser_for_eager_and_compiled():
    assert sl.SignatureError is SignatureError and issubclass(SignatureError, HintError)
    assert compiler_parse_signature is parse_signature
    x = sl.tensor(torch.randn(8, 8), MESH, "S(0), B")
    w = sl.tensor(torch.randn(8, 8), MESH, "B, B")
    # n-D text works eagerly now, written as the compiler's hints write it
    y = sl.apply("matmul", [x, w], signature="(S(0), S(1)), (B, S(0)) -> (S(0), P)")
    assert y.sbp == (S(0), P) and y.record.forced == "signature" and torch.allclose(y.full(), x.full() @ w.full(), atol=1e-5)
    with pytest.raises(SignatureError, match="matmul: cannot parse signature .*exactly one '->'") as e:
        sl.apply("matmul", [x, w], signature="(B, B), (B, B)")
    assert e.value.op == "matmul"
    with pytest.raises(SignatureError, match="matmul: signature .* does not fit .*2-D mesh.*Valid signatures"):
        sl.apply("matmul", [x, w], signature="B, B -> B")  # 1-D text on a 2-D mesh
