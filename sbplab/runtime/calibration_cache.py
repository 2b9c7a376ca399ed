"""The calibration on disk: one JSON file per machine and cluster shape, checked before it is trusted.

FlexFlow and Alpa profile once and reuse; what makes reuse safe is knowing the figures are for THIS
machine. The file is named after the host, device type and world size, and holds the full fingerprint
of the worker machines (CPU model, cores, memory, hostname, device type, GPU name, world size) and the
torch version. A file whose fingerprint or torch version differs (another machine on a shared home,
a torch upgrade, more memory) is reported and measured again, never silently used; so is a file that
cannot be read. Op times accumulate: a later calibration adds the keys it profiled.

Location: ``cache_dir``, else ``$SBPLAB_CACHE``, else ``~/.cache/sbplab``.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..hardware import CommFit, OpKey

FORMAT = 1


def user_name() -> str:
    """Who calibrates: a cache file is one user's (another user's load, or tampering, is not theirs)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        name = f"uid{os.getuid()}" if hasattr(os, "getuid") else "user"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "user"


def default_cache_dir() -> Path:
    env = os.environ.get("SBPLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sbplab"


def fingerprint(facts: list[dict], device_type: str) -> dict:
    """What the figures depend on: the distinct worker machines (without the torch version, kept
    apart), the device type and the world size."""
    machines = sorted({json.dumps({k: v for k, v in f.items() if k != "torch"}, sort_keys=True)
                       for f in facts})
    return {"machines": [json.loads(m) for m in machines], "device_type": device_type,
            "world_size": len(facts)}


def age_text(seconds: float | None) -> str:
    """``"measured 3 min ago"``-style text for a calibration's age."""
    if seconds is None:
        return "age unknown"
    for unit, n in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= n:
            return f"{seconds / n:.0f} {unit}{'s' if unit == 'day' and seconds >= 2 * n else ''} old"
    return f"{seconds:.0f} s old"


def describe(fp: dict) -> str:
    """A short line for ``Hardware.origin``: host(s), CPU, GPU, ranks."""
    hosts = ", ".join(sorted({m["hostname"] for m in fp["machines"]}))
    m = fp["machines"][0]
    dev = m.get("gpu") or m["cpu_model"]
    return f"{hosts} ({dev}, {m['cores']} cores, {fp['world_size']} {fp['device_type']} ranks)"


def cache_path(cache_dir: str | Path | None, fp: dict) -> Path:
    """``<dir>/calibration-<user>-<host>-<device><ranks>.json`` (the host of rank 0's machine): per user
    and machine, even in a directory several users share (``$SBPLAB_CACHE``)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", fp["machines"][0]["hostname"]) or "host"
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return base / f"calibration-{user_name()}-{host}-{fp['device_type']}{fp['world_size']}.json"


@dataclass
class CalibrationRecord:
    """Everything a calibration measured, as stored on disk.

    sweep: the collective sizes (bytes per rank) and repeats the fits were measured with; a request for
        another sweep measures the collectives again.
    peaks: measured ``flops`` and ``mem_bandwidth`` for the roofline.
    measured_at: when the links were measured (seconds since the epoch): ``age_s`` says how old it is.
    load: the machine's load average then (a busy machine's figures include contention).
    """

    fingerprint: dict
    torch: str
    sweep: dict = field(default_factory=dict)
    comm_fits: list[CommFit] = field(default_factory=list)
    firing_overhead: float | None = None
    peaks: dict[str, float] = field(default_factory=dict)
    cores: int | None = None
    op_times: dict[OpKey, float] = field(default_factory=dict)
    measured_at: float | None = None
    load: float | None = None

    @property
    def age_s(self) -> float | None:
        return None if self.measured_at is None else max(0.0, time.time() - self.measured_at)

    def to_json(self) -> dict:
        return {"format": FORMAT, "fingerprint": self.fingerprint, "torch": self.torch, "sweep": self.sweep,
                "comm_fits": [asdict(f) for f in self.comm_fits], "firing_overhead": self.firing_overhead,
                "peaks": self.peaks, "cores": self.cores, "measured_at": self.measured_at, "load": self.load,
                "op_times": [[op, [list(s) for s in shapes], dtype, dev, t]
                             for (op, shapes, dtype, dev), t in sorted(self.op_times.items())]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CalibrationRecord:
        ops = {(op, tuple(tuple(int(x) for x in s) for s in shapes), dtype, dev): float(t)
               for op, shapes, dtype, dev, t in d.get("op_times", [])}
        return cls(fingerprint=d["fingerprint"], torch=d["torch"], sweep=d.get("sweep", {}),
                   comm_fits=[CommFit(**f) for f in d.get("comm_fits", [])],
                   firing_overhead=d.get("firing_overhead"), peaks=dict(d.get("peaks", {})),
                   cores=d.get("cores"), op_times=ops, measured_at=d.get("measured_at"), load=d.get("load"))


def load(path: Path, fp: dict, torch_version: str) -> tuple[CalibrationRecord | None, str | None]:
    """(the record, None) when ``path`` holds a calibration of this machine and torch; (None, why not)
    when it exists but must not be used; (None, None) when there is no file."""
    if not path.exists():
        return None, None
    try:
        d = json.loads(path.read_text())
        if d.get("format") != FORMAT:
            return None, f"{path} has format {d.get('format')!r}, this sbplab writes {FORMAT}"
        rec = CalibrationRecord.from_json(d)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{path} cannot be read as a calibration ({type(e).__name__}: {e})"
    if rec.fingerprint != fp:
        return None, f"{path} was measured on another machine or cluster: {_diff(rec.fingerprint, fp)}"
    if rec.torch != torch_version:
        return None, f"{path} was measured with torch {rec.torch}, the workers run torch {torch_version}"
    return rec, None


def _diff(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new))
    parts = [f"{k}: {old.get(k)!r} there, {new.get(k)!r} here" for k in keys if old.get(k) != new.get(k)]
    return "; ".join(parts)[:400]


def save(path: Path, rec: CalibrationRecord) -> None:
    """Write atomically (a temporary file, then a rename): a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rec.to_json(), f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
