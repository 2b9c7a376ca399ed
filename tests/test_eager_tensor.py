"""Eager global tensors: construction, ops through the registry, signature choice, explain."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.eager import SignatureError

MESH_2x2 = sl.Placement("cpu", [[0, 1], [2, 3]], axis_names=("dp", "tp"))


def test_tensor_and_from_local_round_trip_uneven():
    full = torch.randn(7, 5)
    x = sl.tensor(full, placement=MESH_2x2, sbp="S(0), S(1)", name="x")
    assert x.local_shapes == {0: (4, 3), 1: (4, 2), 2: (3, 3), 3: (3, 2)}
    assert torch.equal(x.full(), full) and x.shape == full.shape
    y = sl.from_local([x.to_local(r) for r in MESH_2x2.rank_list], placement=MESH_2x2, sbp=x.sbp)
    assert y.shape == (7, 5) and torch.equal(y.full(), full)
    assert x.type_str() == "f32[7@dp,5@tp]"


def test_partial_tensor_reduces_on_full():
    mesh = sl.Placement("cpu", 3)
    addends = [torch.randn(4) for _ in range(3)]
    x = sl.from_local(addends, placement=mesh, sbp="P")
    assert torch.allclose(x.full(), sum(addends))
    m = sl.from_local(addends, placement=mesh, sbp="P(max)")
    assert torch.equal(m.full(), torch.stack(addends).max(0).values)


def test_from_local_rejects_unbalanced_shards():
    mesh = sl.Placement("cpu", 2)
    with pytest.raises(ValueError, match="rank 0 holds a shard of shape \\(2, 3\\) but .* gives it \\(3, 3\\)"):
        sl.from_local([torch.zeros(2, 3), torch.zeros(3, 3)], placement=mesh, sbp="S(0)", name="bad")


def test_matmul_keeps_input_sbp_when_a_signature_accepts_it():
    x = sl.tensor(torch.randn(8, 6), placement=sl.Placement("cpu", 4), sbp="S(0)")
    w = sl.tensor(torch.randn(6, 3), placement=x.placement, sbp="B")
    y = x @ w
    assert y.sbp == (sl.S(0),)
    assert y.record.boxings == [] and y.record.chosen.boxing_bytes == 0
    assert str(y.record.chosen.signature) == "(S(0)), (B) -> (S(0))"
    assert torch.allclose(y.full(), x.full() @ w.full(), atol=1e-5)


def test_row_parallel_matmul_gives_partial_then_all_reduce():
    mesh = sl.Placement("cpu", 4)
    x = sl.tensor(torch.randn(8, 12), placement=mesh, sbp="S(1)")
    w = sl.tensor(torch.randn(12, 5), placement=mesh, sbp="S(0)")
    y = x @ w
    assert y.sbp == (sl.P,)
    with sl.explain_log() as log:
        yb = y.to_global(sbp="B")
    assert log.collectives() == {"all_reduce": 1}
    assert log.total_bytes == 4 * 2 * (8 * 5 * 4) * 3 // 4  # 4 ranks each send 2T(p-1)/p
    assert torch.allclose(yb.full(), x.full() @ w.full(), atol=1e-4)
    text = sl.explain(yb)
    assert "all_reduce" in text and "P" in text


def test_cheapest_signature_is_chosen_and_rejected_are_listed():
    mesh = sl.Placement("cpu", 2)
    x = sl.tensor(torch.randn(6, 8), placement=mesh, sbp="S(1)")
    w = sl.tensor(torch.randn(8, 4), placement=mesh, sbp="B")
    y = x @ w  # S(1) x B has no signature: B->S(0) on w is free, so (S(1), S(0)) -> P wins
    assert y.sbp == (sl.P,)
    assert [b.plan.steps[0].kind for b in y.record.boxings] == ["slice"]
    costs = [c.cost_key() for c in [y.record.chosen, *y.record.rejected]]
    assert costs == sorted(costs) and len(y.record.rejected) >= 3
    assert torch.allclose(y.full(), x.full() @ w.full(), atol=1e-5)


def test_forced_signature_and_output_sbp():
    mesh = sl.Placement("cpu", 2)
    x = sl.tensor(torch.randn(6, 8), placement=mesh, sbp="B")
    w = sl.tensor(torch.randn(8, 4), placement=mesh, sbp="B")
    y = sl.apply("matmul", [x, w], signature="B, S(1) -> S(1)")
    assert y.sbp == (sl.S(1),) and y.record.forced == "signature"
    z = sl.apply("matmul", [x, w], sbp="S(0)")
    assert z.sbp == (sl.S(0),)
    for t in (y, z):
        assert torch.allclose(t.full(), x.full() @ w.full(), atol=1e-5)


def test_partial_max_into_matmul_is_refused_when_forced():
    mesh = sl.Placement("cpu", 2)
    x = sl.tensor(torch.randn(4, 4), placement=mesh, sbp="P(max)", name="xmax")
    w = sl.tensor(torch.randn(4, 4), placement=mesh, sbp="B")
    with pytest.raises(SignatureError, match="matmul: signature \\(P\\(max\\)\\), \\(B\\) -> .* not valid.*Valid signatures: .*\\(P\\), \\(B\\) -> \\(P\\)"):
        sl.apply("matmul", [x, w], signature="P(max), B -> P(max)")
    # unforced, the partial max is boxed to a value first: still the right answer
    y = x @ w
    assert y.record.boxings[0].plan.src_sbp == (sl.P("max"),)
    assert torch.allclose(y.full(), x.full() @ w.full(), atol=1e-5)


def test_ops_on_different_placements_are_refused():
    a = sl.tensor(torch.randn(4, 4), placement=sl.Placement("cpu", [0, 1]), sbp="S(0)", name="a")
    b = sl.tensor(torch.randn(4, 4), placement=sl.Placement("cpu", [2, 3]), sbp="S(0)", name="b")
    with pytest.raises(ValueError, match="add: inputs live on different placements: a on .*\\[0, 1\\].*b on .*\\[2, 3\\]"):
        a + b
    c = b.to_global(placement=a.placement)
    assert torch.allclose((a + c).full(), a.full() + b.full())


def test_wrong_sbp_length_names_the_tensor():
    with pytest.raises(ValueError, match="weights: SBP \\(S\\(0\\)\\) has 1 entries but the placement's mesh has 2"):
        sl.tensor(torch.randn(4, 4), placement=MESH_2x2, sbp="S(0)", name="weights")


MESHES = [[0, 1], [0, 1, 2], [[0, 1], [2, 3]], [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]
SBP1 = ["B", "S(0)", "S(1)", "P"]


@settings(max_examples=30, deadline=None)
@given(mesh_i=st.integers(0, len(MESHES) - 1), data=st.data())
def test_mlp_chain_matches_torch_under_any_input_sbps(mesh_i, data):
    mesh = sl.Placement("cpu", MESHES[mesh_i])
    pick = lambda: ", ".join(data.draw(st.sampled_from(SBP1)) for _ in range(mesh.ndim))  # noqa: E731
    n, d, h = data.draw(st.integers(8, 11)), data.draw(st.integers(8, 10)), data.draw(st.integers(8, 12))
    xf, w1f, w2f = torch.randn(n, d), torch.randn(d, h), torch.randn(h, 3 * mesh.size)
    x = sl.tensor(xf, placement=mesh, sbp=pick())
    w1 = sl.tensor(w1f, placement=mesh, sbp=pick())
    w2 = sl.tensor(w2f, placement=mesh, sbp=pick())
    out = ((x @ w1).relu() @ w2).softmax(-1).sum(0)
    want = (torch.relu(xf @ w1f) @ w2f).softmax(-1).sum(0)
    assert torch.allclose(out.full(), want, atol=1e-4, rtol=1e-4)


def test_scalar_operands_and_slicing():
    x = sl.tensor(torch.arange(12.0).reshape(3, 4), placement=sl.Placement("cpu", 2), sbp="S(1)")
    y = (2.0 * x - 1.0)[:, 1:3]
    assert torch.equal(y.full(), (2.0 * torch.arange(12.0).reshape(3, 4) - 1.0)[:, 1:3])
    z = x.reshape(4, 3).transpose(0, 1).mean(dim=0)
    assert torch.allclose(z.full(), torch.arange(12.0).reshape(4, 3).T.mean(0))
