"""Integer tick rates price every step exactly as the Fraction arithmetic they replace.

``ticks.py`` turns a hardware's latencies and inverse bandwidths into whole ticks once, so a step's
time is two integer products. The reference here is the definition, written with Fractions:
``(alpha * rounds + nbytes / bandwidth) * time_scale``. Prices must be equal as integers (not
approximately), on spec-sheet presets and on calibrated hardware with arbitrary measured floats,
for every kind, mesh axis, group size and byte count, and for every step of every layout pair.
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

import sbplab as sl
from sbplab.boxing.costs import (
    _kind_bytes,
    cheapest,
    edge_cost,
    piece_splits,
    state_ok,
    step_kinds,
    step_problem,
    step_rates,
)
from sbplab.boxing.kinds import KINDS
from sbplab.boxing.route import candidates
from sbplab.boxing.ticks import kind_ticks, tick_rate, ticks, time_scale
from sbplab.hardware import CommFit
from sbplab.sbp import B, P, S


def _calibrated() -> sl.Hardware:
    """Measured figures as a calibration leaves them: floats with long binary expansions."""
    rng = random.Random(7)
    fits = [CommFit(k.name, axis, g, rng.uniform(1e-6, 9e-5), rng.uniform(1e8, 5e10))
            for k in KINDS.values() if k.is_collective for axis in (0, 1) for g in (2, None)]
    fits.append(CommFit("send_recv", None, 2, 3.3e-5, 1.7e9))
    return sl.Hardware.cpu_box().with_measurements(origin="test", comm_fits=fits, mem_bandwidth=7.77e9)


HARDWARE = [sl.Hardware.cpu_box(), sl.Hardware.h100_node(), sl.Hardware.a100_node(), sl.Hardware.h100_ib(2),
            _calibrated()]


def _reference(hw: sl.Hardware, kind, axis: int | None, group: int, nbytes: int, messages: int = 1) -> int:
    if kind.moves_data and group <= 1:
        return 0
    alpha, bw = kind.alpha_beta(hw, axis, group)
    t = (Fraction(alpha) * kind.rounds(group, messages) + Fraction(nbytes) / Fraction(bw)) * time_scale(hw)
    assert t.denominator == 1
    return t.numerator


@pytest.mark.parametrize("hw", HARDWARE, ids=lambda h: h.name + (" measured" if h.measured else ""))
def test_kind_ticks_equal_the_fraction_definition(hw):
    rng = random.Random(0)
    sizes = [0, 1, 3, 4, 1000, 2**20 + 7] + [rng.randrange(1, 2**34) for _ in range(40)]
    n = 0
    for kind in KINDS.values():
        for axis, group, nbytes, messages in itertools.product((0, 1, 2, None), (1, 2, 3, 4, 8), sizes, (1, 3)):
            got = kind_ticks(kind, hw, axis, group, nbytes, messages)
            assert isinstance(got, int)
            assert got == _reference(hw, kind, axis, group, nbytes, messages), (kind.name, axis, group, nbytes)
            # and the float time the rest of sbplab reports agrees to rounding
            assert got / time_scale(hw) == pytest.approx(kind.duration(hw, axis, group, nbytes, messages)
                                                         if not (kind.moves_data and group <= 1) else 0.0,
                                                         rel=1e-12, abs=1e-18)
            n += 1
    assert n > 3000


def test_ticks_reject_a_figure_the_hardware_does_not_have():
    hw = sl.Hardware.cpu_box()
    assert ticks(hw, hw.axis_latency[0], 3, 100, hw.axis_bandwidth[0]) == tick_rate(hw, hw.axis_latency[0],
                                                                                     hw.axis_bandwidth[0])(3, 100)
    with pytest.raises(ValueError, match="not a figure of hardware"):
        tick_rate(hw, 1.234567e-7, 3.3e9)


def _reference_key(shape, mesh, state, axis, new, hw):
    """The cheapest kind's (ticks, bytes sent by all ranks, 1), its time priced with Fractions (the
    bytes are the kinds' own arithmetic, which this change leaves alone); the first kind wins ties."""
    splits = piece_splits(state, axis)
    best = None
    for kind in step_kinds(state[axis], new):
        sent, _, busy, _ = _kind_bytes(kind, shape, mesh, splits, axis, state[axis], new, 4)
        key = (_reference(hw, kind, axis, mesh[axis], busy), sum(sent), 1)
        if best is None or key < best:
            best = key
    return best


@pytest.mark.parametrize("hw", [HARDWARE[0], HARDWARE[3], HARDWARE[4]], ids=["cpu", "ib", "measured"])
def test_every_step_of_every_layout_is_priced_exactly(hw):
    shape, mesh = (12, 10), (2, 3, 2)
    cands = candidates(len(shape), ("max", "sum"))
    n = 0
    for state in itertools.product(cands, repeat=len(mesh)):
        if not state_ok(shape, mesh, state):
            continue
        for axis, new in itertools.product(range(len(mesh)), cands):
            if new == state[axis] or not step_kinds(state[axis], new) or step_problem(state, axis, new):
                assert edge_cost(shape, mesh, state, axis, new, 4, hw) is None
                continue
            c = edge_cost(shape, mesh, state, axis, new, 4, hw)
            want = _reference_key(shape, mesh, state, axis, new, hw)
            kinds = step_kinds(state[axis], new)
            assert c.key == want == cheapest(shape, mesh, piece_splits(state, axis), axis, state[axis], new, 4,
                                             kinds, step_rates(kinds, hw, axis, mesh[axis]))[0]
            assert c.time_s == c.ticks / time_scale(hw)
            n += 1
    assert n > 500


def test_ties_still_break_on_bytes_then_steps():
    """A reduce-scatter then an all-gather costs exactly one all-reduce in ticks (the model says so)."""
    hw, shape, mesh = sl.Hardware.cpu_box(), (16, 8), (4,)
    ar = edge_cost(shape, mesh, (P,), 0, B, 4, hw)
    rs = edge_cost(shape, mesh, (P,), 0, S(0), 4, hw)
    ag = edge_cost(shape, mesh, (S(0),), 0, B, 4, hw)
    assert (ar.kind, rs.kind, ag.kind) == ("all_reduce", "reduce_scatter", "all_gather")
    assert ar.ticks == rs.ticks + ag.ticks
