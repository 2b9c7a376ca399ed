"""Placements and SBP values: parsing, validation, reprs."""

from __future__ import annotations

import pytest

import sbplab as sl
from sbplab.sbp import as_nd_sbp, parse_sbp


def test_sbp_values_and_reprs():
    assert repr(sl.S(1)) == "S(1)" and repr(sl.B) == "B" and repr(sl.P) == "P"
    assert repr(sl.P("max")) == "P(max)" and sl.P("max") == sl.Partial("max")
    assert sl.P("sum") == sl.P and sl.S(0) != sl.S(1)
    assert sl.fmt_sbp((sl.S(0), sl.B)) == "(S(0), B)"


@pytest.mark.parametrize("text,want", [
    ("S(0), B", (sl.S(0), sl.B)),
    ("(P, S(1))", (sl.P, sl.S(1))),
    ("[B, P(max), S(-1)]", (sl.B, sl.P("max"), sl.S(-1))),
    ("S( 2 )", (sl.S(2),)),
    ("P(min)", (sl.P("min"),)),
])
def test_parse_sbp(text, want):
    assert parse_sbp(text) == want


@pytest.mark.parametrize("bad", ["S(x)", "Q", "S(0) B", "", "P(avg)"])
def test_parse_sbp_rejects_with_message(bad):
    with pytest.raises(ValueError, match="SBP|P\\(op\\)"):
        parse_sbp(bad)


def test_as_nd_sbp_checks_length_and_dims():
    assert as_nd_sbp("S(-1), B", 2, tensor_ndim=3) == (sl.S(2), sl.B)
    with pytest.raises(ValueError, match="x: SBP \\(S\\(0\\)\\) has 1 entries but the placement's mesh has 2 axes"):
        as_nd_sbp("S(0)", 2, what="x")
    with pytest.raises(ValueError, match="w: S\\(3\\) is out of range for a 2-D tensor; valid split dims are 0..1"):
        as_nd_sbp("S(3)", 1, tensor_ndim=2, what="w")
    with pytest.raises(ValueError, match="P\\(op\\) needs op"):
        sl.P("avg")


def test_placement_keeps_rank_order_and_groups():
    p = sl.Placement("cpu", [[3, 1], [0, 2]], axis_names=("dp", "tp"))
    assert p.shape == (2, 2) and p.rank_list == (3, 1, 0, 2)  # never sorted
    assert p.coords(0) == (1, 0) and p.rank_at((0, 1)) == 1
    assert p.groups("dp") == [(3, 0), (1, 2)] and p.groups(1) == [(3, 1), (0, 2)]
    assert p.group_of(2, "tp") == (0, 2)
    assert sl.Placement("cpu", 4).rank_list == (0, 1, 2, 3)
    assert p == sl.Placement("cpu", [[3, 1], [0, 2]], axis_names=("dp", "tp"))
    assert "axis_names=('dp', 'tp')" in repr(p)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(device_type="tpu", ranks=[0]), "device_type must be one of"),
    (dict(device_type="cpu", ranks=[0, 0]), "distinct; repeated: \\[0\\]"),
    (dict(device_type="cpu", ranks=[[0, 1], [2]]), "not a rectangular mesh"),
    (dict(device_type="cpu", ranks=[[0, 1]], axis_names=("a",)), "axis_names .* 1 names but the mesh has 2"),
    (dict(device_type="cpu", ranks=[-1]), ">= 0"),
])
def test_placement_errors(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        sl.Placement(**kwargs)
