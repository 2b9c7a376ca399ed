"""Bad requests get errors that say what was wrong and what would be valid."""

from __future__ import annotations

import pytest
import torch

import sbplab as sl
from sbplab.boxing import BoxingStep, plan_boxing
from sbplab.sbp import B

MESH = sl.Placement("cpu", [[0, 1], [2, 3]])


@pytest.mark.parametrize("src,dst,match", [
    ("S(0)", "B, B", r"src_sbp: SBP \(S\(0\)\) has 1 entries but the placement's mesh has 2 axes"),
    ("B, B", "B, B, B", r"dst_sbp: SBP \(B, B, B\) has 3 entries.*one SBP per mesh axis"),
    ("S(2), B", "B, B", r"src_sbp: S\(2\) is out of range for a 2-D tensor; valid split dims are 0\.\.1"),
    ("B, B", "S(-3), B", r"dst_sbp: S\(-3\) is out of range"),
    ("B, S(0)", "B, B", None),
    ("S(0), S(0)", "B, B", r"src_sbp: dim 0 has 1 elements at mesh axis 1.*empty shards are not allowed"),
    ("B, B", "X(1), B", r"cannot parse SBP 'X\(1\), B'.*S\(0\), B, P, P\(max\)"),
])
def test_sbp_errors(src, dst, match):
    shape = (3, 8)  # dim 0 splits into 2 (2 + 1 rows), but not again
    if match is None:
        assert plan_boxing(shape, src, dst, MESH).dst_sbp == (B, B)
        return
    with pytest.raises(ValueError, match=match):
        plan_boxing(shape, src, dst, MESH)


def test_dst_placement_errors_name_dst():
    with pytest.raises(ValueError, match=r"dst_sbp: dim 0 has 3 elements at mesh axis 0.*4 parts"):
        plan_boxing((3, 8), "B, B", "S(0)", MESH, sl.Placement("cpu", [4, 5, 6, 7]))


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(shape=(4, "x")), TypeError, "shape must be a sequence of ints"),
    (dict(shape=(4, -1)), ValueError, "negative dim"),
    (dict(placement=[[0, 1], [2, 3]]), TypeError, "placement must be an sl.Placement"),
    (dict(dst_placement="cpu"), TypeError, "dst_placement must be an sl.Placement or None"),
    (dict(dtype="float32"), TypeError, r"dtype must be a torch.dtype such as torch.float32"),
    (dict(hardware="h100"), TypeError, "hardware must be an sl.Hardware or None"),
])
def test_argument_errors(kwargs, exc, match):
    args = dict(shape=(4, 4), src_sbp="S(0), B", dst_sbp="B, B", placement=MESH)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        plan_boxing(**args)


def test_run_checks_its_shards():
    plan = plan_boxing((4, 4), "S(0), B", "B, B", MESH)
    shards = sl.shard(torch.zeros(4, 4), MESH, plan.src_sbp)
    del shards[3]
    with pytest.raises(ValueError, match=r"one shard per rank.*ranks \[0, 1, 2, 3\], got ranks \[0, 1, 2\]"):
        plan.run(shards)
    shards[3] = torch.zeros(4, 4)
    with pytest.raises(ValueError, match=r"rank 3's shard has shape \(4, 4\) but .* gives it \(2, 4\)"):
        plan.run(shards)


def test_step_validation():
    kw = dict(mesh_axis=0, src_sbp=(B,), dst_sbp=(B,), placement=sl.Placement("cpu", 2), groups=(),
              bytes_sent={}, bytes_recv={}, time_s=0.0, why="")
    with pytest.raises(ValueError, match="kind must be one of"):
        BoxingStep(kind="teleport", **kw)
    with pytest.raises(ValueError, match="needs src_placement"):
        BoxingStep(kind="send_recv", **kw)
    with pytest.raises(ValueError, match="time_s must be >= 0"):
        BoxingStep(kind="slice", **{**kw, "time_s": -1.0})
