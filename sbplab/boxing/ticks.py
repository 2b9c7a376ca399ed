"""Exact step times as integer ticks: the alpha-beta model without rounding and without Fractions.

Route searches add step times. Added as floats, a reduce-scatter plus an all-gather would not always
tie with the all-reduce the model says they equal, and rounding noise would decide instead of the
tie-break on bytes and steps. So every time is a whole number of ticks of ``1 / time_scale(hw)``
seconds, the least common multiple of the denominators of every latency and every inverse bandwidth
of ``hw`` (each float is an exact binary fraction). Then a step's time

    alpha * rounds + nbytes / bandwidth   =   alpha_ticks * rounds + nbytes * byte_ticks   (ticks)

with ``alpha_ticks = alpha * time_scale`` and ``byte_ticks = time_scale / bandwidth`` both whole
numbers, worked out once per hardware and kind: pricing a step is two integer products, where it
used to build Fractions for every step of every search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from ..hardware import Hardware
from .kinds import StepKind, on_change


@lru_cache(maxsize=64)
def time_scale(hardware: Hardware) -> int:
    """Ticks per second such that every alpha-beta time on ``hardware`` is a whole number of ticks.

    Search keys add integer ticks: exact (a reduce-scatter plus an all-gather ties with an
    all-reduce, as the model says, and the tie-break on bytes then steps decides, not rounding noise)
    and much faster to add than Fractions. Measured per-kind fits count too.
    """
    lats = [*hardware.axis_latency, hardware.p2p_latency, *(f.alpha for f in hardware.comm_fits)]
    bws = [*hardware.axis_bandwidth, hardware.p2p_bandwidth, hardware.mem_bandwidth,
           *(f.bandwidth for f in hardware.comm_fits)]
    dens = [Fraction(x).denominator for x in lats] + [(1 / Fraction(x)).denominator for x in bws]
    return math.lcm(*dens)


@dataclass(frozen=True)
class TickRate:
    """One link's alpha-beta figures in ticks: per latency round and per byte (both whole numbers)."""

    per_round: int
    per_byte: int

    def __call__(self, rounds: int, nbytes: int) -> int:
        return self.per_round * rounds + nbytes * self.per_byte


@lru_cache(maxsize=1024)
def tick_rate(hardware: Hardware, latency: float, bandwidth: float) -> TickRate:
    """``latency`` and ``1 / bandwidth`` in ticks of ``time_scale(hardware)`` (both figures of ``hardware``)."""
    scale = time_scale(hardware)
    per_round = Fraction(latency) * scale
    per_byte = scale / Fraction(bandwidth)
    if per_round.denominator != 1 or per_byte.denominator != 1:
        raise ValueError(f"latency {latency!r} or bandwidth {bandwidth!r} is not a figure of hardware "
                         f"{hardware.name!r}, so its time is not a whole number of ticks")
    return TickRate(per_round.numerator, per_byte.numerator)


def ticks(hardware: Hardware, latency: float, steps: int, nbytes: int, bandwidth: float) -> int:
    """``latency * steps + nbytes / bandwidth`` (Hardware.ring_time) in exact ticks of time_scale."""
    return tick_rate(hardware, latency, bandwidth)(steps, nbytes)


@lru_cache(maxsize=4096)
def kind_rate(kind: StepKind, hardware: Hardware, axis: int | None, group_size: int) -> TickRate | None:
    """The tick rate of ``kind`` on mesh ``axis`` (None: between placements) for a group of
    ``group_size``; None when the step takes no time (a data move within a group of one)."""
    if kind.moves_data and group_size <= 1:
        return None
    alpha, bw = kind.alpha_beta(hardware, axis, group_size)
    return tick_rate(hardware, alpha, bw)


def kind_ticks(kind: StepKind, hardware: Hardware, axis: int | None, group_size: int, nbytes: int,
               messages: int = 1) -> int:
    """``kind.duration(...)`` in exact ticks: the same alpha-beta figures, added without rounding."""
    rate = kind_rate(kind, hardware, axis, group_size)
    return 0 if rate is None else rate(kind.rounds(group_size, messages), nbytes)


on_change(kind_rate.cache_clear)  # a kind registered again under a name may price differently
