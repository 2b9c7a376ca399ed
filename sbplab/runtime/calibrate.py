"""``calibrate``: measure this cluster once and return it as a ``Hardware`` the simulator reads.

    with sl.LocalCluster(2) as cluster:
        hw = cluster.calibrate(c)                 # c: a compiled step (or an ActorPlan, or a list)
    sl.simulate(c, hw).step_time                  # op times and links measured here, not guessed

Everything is measured ON THE WORKERS by running ordinary ActorPlans through ``cluster.run`` and
reading the trace: no message or worker code exists for calibration. So the same call works for a
cluster of workers started elsewhere with torchrun (``launch="external"``): it measures their machine.

What is measured (BRIEF section 5, "Calibrate, don't guess"):
- each collective kind per mesh axis and group size the cluster can form, over a sweep of sizes, fitted
  as alpha-beta (``calibrate_comm``), and point to point between two ranks; on CPU ranks that can
  fill the machine's cores, also the latency while every core computes (``calibrate_busy``);
- the runtime's overhead per actor firing (a chain of empty kernels);
- every distinct (op, local input shapes, dtype, device) of the given steps' compute actors, once
  (``calibrate_ops``), plus a matmul's FLOP/s and a copy's bytes/s for the roofline of the rest;
- the cores the ranks share (the worker machine's ``os.cpu_count()``).

The figures are cached on disk per user and machine (``calibration_cache``): a later call measures only
what is new (ops not profiled yet, a different size sweep), and a cache from another machine or torch
version is reported and measured again. Whether to trust them (``calibrate_trust``): a busy machine is
warned about before measuring, a physically impossible link fit is rejected and capped with a warning,
``Calibration.noise`` says how noisy the fits were and ``age_s`` how old the figures are; a bar shows
the progress.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..hardware import CommFit, Hardware, OpKey
from .calibrate_busy import measure_busy
from .calibrate_comm import measure_collectives, measure_p2p
from .calibrate_ops import measure_firing_overhead, op_instances, peak_instances, peaks_from, profile_ops
from .calibrate_trust import (
    CalibrationBusyWarning,
    CalibrationFitWarning,
    busy_message,
    machine_load,
    noise_of,
    noise_statement,
    phase_bar,
    reject_impossible,
)
from .calibration_cache import CalibrationRecord, age_text, cache_path, describe, fingerprint, load, save
from .calibration_probe import read_worker_facts

DEFAULT_SIZES = tuple(1 << k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB per rank, log spaced
DEFAULT_REPEATS = 5
PEAK_SIZES = {"cpu": (512, 32 * 2**20), "cuda": (4096, 256 * 2**20)}  # (matmul n, copy bytes) per device


class CalibrationCacheWarning(UserWarning):
    """A cache file exists for this machine's name but may not be used (other machine, other torch)."""


@dataclass(frozen=True)
class MeasuredNow:
    """What this call measured (the rest came from the cache): the collective sweep, the firing
    overhead, the peaks, and how many op configurations were profiled."""

    comm: bool = False
    overhead: bool = False
    peaks: bool = False
    ops: int = 0

    @property
    def anything(self) -> bool:
        return self.comm or self.overhead or self.peaks or self.ops > 0


@dataclass
class Calibration:
    """A calibration's Hardware and how it came about.

    path: the cache file (None with ``cache=False``).
    reused: a cache file of this machine and torch version was found and used.
    stale: why a cache file that was found was NOT used (another machine, another torch, unreadable).
    skipped: op configurations that could not be profiled (their kernel raised on random inputs), and
        why; the simulator models them with the roofline.
    """

    hardware: Hardware
    measured: MeasuredNow
    path: Path | None = None
    reused: bool = False
    stale: str | None = None
    skipped: dict[OpKey, str] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)  # link fits that were physically impossible, and the cap
    load: float | None = None  # the machine's load average when the links were measured
    age_s: float | None = None  # how old the link figures are (seconds; 0: measured now)
    noise: float = 0.0  # the largest median relative error of a link fit

    @property
    def repeatability(self) -> str:
        """Whether another calibration can be expected to agree, from how noisy the fits were."""
        return noise_statement(self.noise)

    def summary(self) -> str:
        cores = self.hardware.cores
        busy = f", load {self.load:.1f}" + (f" on {cores} cores" if cores else "") if self.load is not None else ""
        return "\n".join([f"{self.hardware.origin}: links {age_text(self.age_s)}{busy}",
                          self.repeatability, *(f"rejected: {r}" for r in self.rejected)])


def _check_args(cluster: Any, sizes: Sequence[int], repeats: int) -> tuple[int, ...]:
    if not (hasattr(cluster, "run") and hasattr(cluster, "n") and hasattr(cluster, "device_type")):
        raise TypeError(f"calibrate needs a LocalCluster (spawned or external workers), "
                        f"got {type(cluster).__name__}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"calibrate: repeats must be an int >= 1 (steady steps per measurement), "
                         f"got {repeats!r}")
    try:
        sz = tuple(int(s) for s in sizes)
    except (TypeError, ValueError):
        raise TypeError(f"calibrate: sizes must be a sequence of byte counts, got {sizes!r}") from None
    if len(set(sz)) < 2 or min(sz) < 4:
        raise ValueError(f"calibrate: sizes needs at least 2 distinct byte counts >= 4 (one float32) to fit "
                         f"alpha and bandwidth, got {sz}")
    return tuple(sorted(set(sz)))


def calibrate_report(cluster: Any, steps: Any = None, *, sizes: Sequence[int] = DEFAULT_SIZES,
                     repeats: int = DEFAULT_REPEATS, cache: bool = True, cache_dir: str | Path | None = None,
                     feeds: Mapping[str, Any] | None = None, refresh: bool = False,
                     matmul_n: int | None = None, copy_bytes: int | None = None,
                     progress: bool = True) -> Calibration:
    """``calibrate`` with the story: what was measured now, what came from the cache, what was skipped.

    feeds: batch tensors or shapes for ActorPlans with Source actors (a compiled step knows its own).
    refresh: measure everything again even when the cache is valid (the file is then rewritten).
    matmul_n, copy_bytes: the square matmul and the copy that measure the roofline's peaks (default:
        big enough to reach the device's speed, ``PEAK_SIZES``).
    progress: a bar over the parts measured (terminal or notebook).
    """
    sweep_sizes = _check_args(cluster, sizes, repeats)
    dev = cluster.device_type
    insts = op_instances(steps, dev, feeds)  # bad steps fail here, before anything runs
    facts = read_worker_facts(cluster)
    fp = fingerprint(facts, dev)
    torch_version = ",".join(sorted({f["torch"] for f in facts}))
    path = cache_path(cache_dir, fp) if cache else None
    rec, stale = (None, None) if path is None or refresh else load(path, fp, torch_version)
    if stale:
        warnings.warn(f"calibration cache not used, measuring again: {stale}", CalibrationCacheWarning,
                      stacklevel=2)
    reused = rec is not None
    rec = rec or CalibrationRecord(fp, torch_version)
    rec.cores = _cores(facts)
    sweep = {"sizes": list(sweep_sizes), "repeats": repeats, "busy": True}
    comm = rec.sweep != sweep or (cluster.n >= 2 and not rec.comm_fits)
    overhead = rec.firing_overhead is None
    mm, cp = peak_instances(dev, matmul_n or PEAK_SIZES[dev][0], copy_bytes or PEAK_SIZES[dev][1])
    peaks = [i for i in (mm, cp) if i.key not in rec.op_times]
    peak_keys = {i.key for i in peaks}
    new = [i for k, i in insts.items() if k not in rec.op_times and k not in peak_keys]
    load_now = machine_load()
    busy = busy_message(load_now, rec.cores) if comm or overhead or peaks or new else None
    if busy:
        warnings.warn(busy, CalibrationBusyWarning, stacklevel=2)
    bar = phase_bar((2 + (dev == "cpu") if comm else 0) + overhead + bool(peaks or new), progress)
    try:
        if comm:
            bar.set_postfix_str("point to point")
            p2p = measure_p2p(cluster, sweep_sizes, repeats)
            bar.update()
            bar.set_postfix_str("collectives")
            fits = measure_collectives(cluster, sweep_sizes, repeats) + ([p2p] if p2p else [])
            bar.update()
            if dev == "cpu":  # a GPU rank has its own device: nothing to wait for
                bar.set_postfix_str("links while the cores compute")
                fits = measure_busy(cluster, fits, sweep_sizes, repeats, rec.cores)
                bar.update()
            rec.comm_fits, rec.sweep, rec.measured_at, rec.load = fits, sweep, time.time(), load_now
        if overhead:
            bar.set_postfix_str("firing overhead")
            rec.firing_overhead = measure_firing_overhead(cluster, repeats)
            bar.update()
        if peaks or new:
            bar.set_postfix_str(f"peaks and {len(new)} ops")
        times, skipped = profile_ops(cluster, peaks + new, repeats)
        if peaks or new:
            bar.update()
    finally:
        bar.close()
    rec.op_times.update(times)
    if mm.key in rec.op_times and cp.key in rec.op_times:
        rec.peaks = peaks_from(rec.op_times, mm, cp)
    floor = Hardware.cpu_box().mem_bandwidth if dev == "cpu" else 0.0  # a busy copy must not condemn a link
    rec.comm_fits, rejected = reject_impossible(rec.comm_fits, max(rec.peaks.get("mem_bandwidth", 0.0), floor))
    for why in rejected if comm else ():
        warnings.warn(f"calibration: a link fit is physically impossible: {why}", CalibrationFitWarning,
                      stacklevel=2)
    if path is not None:
        save(path, rec)
    measured = MeasuredNow(comm=comm, overhead=overhead, peaks=bool(peaks),
                           ops=sum(1 for i in new if i.key in times))
    return Calibration(hardware_of(rec, dev), measured, path, reused, stale, skipped, rejected, rec.load, rec.age_s,
                       noise_of(rec.comm_fits))


def calibrate(cluster: Any, steps: Any = None, *, sizes: Sequence[int] = DEFAULT_SIZES,
              repeats: int = DEFAULT_REPEATS, cache: bool = True, cache_dir: str | Path | None = None,
              **options: Any) -> Hardware:
    """Measure ``cluster``'s workers and return a calibrated ``Hardware`` (see the module docstring).

    steps: compiled steps or ActorPlans (one or a list) whose compute ops to profile; None: links,
        overhead and peaks only (ops are then all modelled by the measured roofline).
    sizes: collective sizes in bytes per rank (at least two); repeats: steady steps per measurement.
    cache, cache_dir: reuse and extend the on-disk calibration of this machine
        (``$SBPLAB_CACHE`` or ``~/.cache/sbplab`` by default).
    options: ``feeds``, ``refresh``, ``matmul_n``, ``copy_bytes`` (``calibrate_report``).
    Works the same for spawned workers and for workers started with torchrun (``launch="external"``):
    it only runs ordinary plans.
    """
    return calibrate_report(cluster, steps, sizes=sizes, repeats=repeats, cache=cache, cache_dir=cache_dir,
                            **options).hardware


def _cores(facts: list[dict]) -> int:
    """Cores the ranks share: the machine's count, summed over machines when ranks span several."""
    per_host = {f["hostname"]: int(f["cores"]) for f in facts}
    return max(1, sum(per_host.values()))


def _links(fits: list[CommFit]) -> dict[str, Any]:
    """The links' own figures, which kinds without a fit of their own fall back to
    (``Hardware.alpha_beta``): per mesh axis the median alpha and bandwidth of the kinds measured over
    its largest group (robust to one noisy kind); point to point from the fit without an axis."""
    by_axis: dict[int, list[CommFit]] = {}
    out: dict[str, Any] = {}
    for f in fits:
        if f.axis is None:
            out["p2p_bandwidth"], out["p2p_latency"] = f.bandwidth, f.alpha
            continue
        have = by_axis.setdefault(f.axis, [])
        if have and f.group_size > have[0].group_size:
            have.clear()
        if not have or f.group_size == have[0].group_size:
            have.append(f)
    axes = sorted(by_axis)
    if axes and axes == list(range(len(axes))):
        out["axis_bandwidth"] = tuple(statistics.median(f.bandwidth for f in by_axis[a]) for a in axes)
        out["axis_latency"] = tuple(statistics.median(f.alpha for f in by_axis[a]) for a in axes)
    return out


def hardware_of(rec: CalibrationRecord, device_type: str) -> Hardware:
    """The calibrated Hardware: ``cpu_box()`` with every measured figure put in."""
    n = rec.fingerprint["world_size"]
    hw = Hardware.cpu_box().with_measurements(
        name=f"calibrated_{device_type}{n}",
        origin=f"measured on {describe(rec.fingerprint)}"
               + (f" at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(rec.measured_at))}" if rec.measured_at else ""),
        op_times=rec.op_times.items(), comm_fits=rec.comm_fits, firing_overhead=rec.firing_overhead,
        cores=rec.cores, **_links(rec.comm_fits), **rec.peaks)
    return hw if device_type == "cpu" else replace(hw, cores=None)  # a GPU rank has its own device
