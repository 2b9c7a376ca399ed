"""The search prices a strided split (a fused layer's ``S(d, chunks=k)``, which only ops make and read)
as a boxing never taken where no collective moves it, and floors it on the walks the route search may take
(to and from B and P only): a model with fused QKV layers is searched instead of failing on the first
such pair."""

from __future__ import annotations

import pytest
import torch

import sbplab as sl
from sbplab.ops.registry import TensorMeta
from sbplab.sbp import B, S
from sbplab.search.box_floors import FloorBoxes
from sbplab.search.box_prices import UNREACHABLE_S, BoxPrices


def test_a_strided_split_no_collective_moves_is_never_taken_and_floored_through_b():
    hw = sl.Hardware.h100_node()
    meta = TensorMeta((8, 12, 16), torch.float32)
    strided = S(1, chunks=3)
    placement = sl.Placement(None, 4)
    boxes = BoxPrices().for_mesh(placement, hw)
    # boxing moves a strided split to and from B: a free slice of each chunk, an all-gather then a reorder
    assert boxes.time(meta, (B,), (strided,)) == 0.0
    gather = sl.boxing.plan_boxing(meta.shape, (strided,), (B,), sl.Placement("cpu", 4), hardware=hw)
    assert [s.kind for s in gather.steps] == ["all_gather"]
    assert boxes.time(meta, (strided,), (B,)) == pytest.approx(gather.time_s) and gather.time_s < UNREACHABLE_S
    assert boxes.time(meta, (strided,), (S(0),)) < UNREACHABLE_S  # to another split through B
    assert boxes.time(meta, (strided,), (strided,)) == 0.0
    assert 0.0 < boxes.time(meta, (B,), (S(1),)) + boxes.time(meta, (S(1),), (B,)) < UNREACHABLE_S
    floors = FloorBoxes().for_mesh(placement, hw).matrix(meta, [(B,), (strided,)], [(strided,), (S(1),)])
    assert floors.shape == (2, 2) and floors[0, 0] == 0.0
    # out of a strided split only through B (an all-gather): its floor, below the price, is not 0
    assert 0.0 < floors[1, 1] <= boxes.time(meta, (strided,), (S(1),))
    lat = FloorBoxes(latency_only=True).for_mesh(placement, hw).matrix(meta, [(strided,)], [(S(1),)])
    assert 0.0 < lat[0, 0] < floors[1, 1]  # the all-gather's rounds without its bytes
