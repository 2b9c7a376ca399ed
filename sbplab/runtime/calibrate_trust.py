"""Whether a calibration can be trusted: impossible fits, a busy machine, how noisy it was, a progress bar.

Why: on a shared machine a calibration measured contention rather than the machine (a send/recv fit
of 1,000,000 GB/s, predictions 74-85% off, a ranking that flipped between two runs), silently, after
68 s without a sign of life. So:

- a link faster than the memory it is copied through cannot be: a transfer between processes on one
  machine copies every byte at least once (read and written: at most half the copy bandwidth as the
  roofline counts it, bytes read plus written), and a GPU link is no faster than the GPU's own memory.
  The bound is ``MARGIN`` times the copy bandwidth (the one measured on the same workers, never below
  the device's preset figure: a copy timed on a busy machine comes out slow, and must not condemn real
  links), so only what is impossible by a wide margin is rejected. Such a fit is reported
  (``CalibrationFitWarning`` says which, by how much and why) and its bandwidth capped at the bound; its
  latency stays as fitted. (``fit_alpha_beta`` returns ``FREE_BANDWIDTH`` when the large sizes it timed
  took no longer than the small ones: noise, not a free link.)
- a machine whose load average is above its cores is busy: every figure would include waiting for a
  core. ``CalibrationBusyWarning`` says so before anything is measured, with the load and the cores.
- a bar (``phase_bar``) moves after each part (links, links while busy, firing overhead, peaks and ops),
  in a terminal or a notebook, so a long calibration shows it is alive;
- how noisy it was: each alpha-beta fit knows its median relative error over the sizes it timed; the
  calibration reports the largest, so a reader sees whether two calibrations can be expected to agree
  (``Calibration.noise``, ``REPEATABLE``).
"""

from __future__ import annotations

import os
from dataclasses import replace

from ..hardware import CommFit
from .progress import SilentBar

MARGIN = 2.0  # a link may reach this many times the copy bandwidth before it is called impossible (one copy: 0.5)
REPEATABLE = 0.10  # a calibration whose fits are all within this median relative error predicts within about it


class CalibrationBusyWarning(UserWarning):
    """The machine was busy (load average above its cores) while the calibration measured it."""


class CalibrationFitWarning(UserWarning):
    """A measured link fit was physically impossible and was capped."""


def machine_load() -> float | None:
    """The 1-minute load average of this machine, or None where the OS does not say."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def busy_message(load: float | None, cores: int) -> str | None:
    """A sentence when ``load`` exceeds ``cores``, else None."""
    if load is None or load <= cores:
        return None
    return (f"this machine is busy (load average {load:.1f} on {cores} cores): the calibration measures its "
            f"links and kernels while other work competes for the cores, so its figures include that "
            f"contention and a later, quieter calibration may differ; calibrate again when the load is below "
            f"{cores} (refresh=True) for figures of the machine itself")


def reject_impossible(fits: list[CommFit], copy_bandwidth: float | None) -> tuple[list[CommFit], list[str]]:
    """(fits with every physically impossible bandwidth capped, a sentence per capped fit).

    ``copy_bandwidth``: bytes/s of a memory copy on these workers, as the roofline counts it (bytes read
    plus written); a transfer moves its bytes through that memory, so no link beats ``MARGIN`` times it."""
    if not copy_bandwidth or copy_bandwidth <= 0:
        return fits, []
    bound = MARGIN * copy_bandwidth
    out, said = [], []
    for f in fits:
        if f.bandwidth > bound:
            where = "point to point" if f.axis is None else f"mesh axis {f.axis}, {f.group_size} ranks"
            said.append(f"{f.kind} ({where}) fitted {f.bandwidth / 1e9:.4g} GB/s, more than {MARGIN:g}x the "
                        f"memory copy bandwidth of these workers ({copy_bandwidth / 1e9:.4g} GB/s), which no link "
                        f"can be: the larger sizes took no longer than the small ones (noise). Capped at "
                        f"{bound / 1e9:.4g} GB/s; calibrate on a quieter machine, or with larger sizes, for a "
                        f"real figure")
            f = replace(f, bandwidth=float(bound))
        out.append(f)
    return out, said


def noise_of(fits: list[CommFit]) -> float:
    """The largest median relative error of the link fits (0 without fits)."""
    return max((f.rel_error for f in fits), default=0.0)


def noise_statement(noise: float) -> str:
    if noise <= REPEATABLE:
        return (f"repeatable: every link fit is within {noise:.0%} of what it timed (median), so another "
                f"calibration of this machine, as quiet, predicts within about {REPEATABLE:.0%}")
    return (f"noisy: a link fit is {noise:.0%} off what it timed (median), above the {REPEATABLE:.0%} a "
            f"repeatable calibration stays within; predictions from it may move by that much between two "
            f"calibrations")


def phase_bar(total: int, enabled: bool):
    """A tqdm bar over a calibration's parts (notebook widget or terminal text), or a silent stand-in."""
    if not enabled or total <= 0:
        return SilentBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency, but a bar is never worth failing a calibration for
        return SilentBar()
    return tqdm(total=total, desc="calibrate", unit="part", leave=False)
