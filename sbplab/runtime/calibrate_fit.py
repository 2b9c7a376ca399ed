"""Alpha-beta fits: ``time = alpha * rounds + bytes / bandwidth`` from measured (bytes, seconds) points.

The fit minimises the RELATIVE error of each point (each row is divided by its measured time), so a
1 KiB collective counts as much as a 16 MiB one: otherwise the largest sizes decide everything and the
latency, which decides small transfers, comes out as noise. Non-negative least squares
(``scipy.optimize.nnls``) keeps alpha >= 0 and the per-byte cost >= 0; the fit's median relative
error is reported with it, so a reader can tell a clean link from a noisy one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from ..hardware import CommFit

FREE_BANDWIDTH = 1e15  # bytes/s standing in for "bytes cost nothing measurable" (a zero per-byte slope)


def fit_alpha_beta(kind: str, axis: int | None, group_size: int, rounds: int,
                   points: Sequence[tuple[float, float]]) -> CommFit:
    """Fit ``kind`` on ``axis`` over ``group_size`` ranks; ``points`` are (bytes the busiest rank sends,
    seconds), ``rounds`` the kind's latency terms (ring steps, or 1 per message)."""
    pts = [(float(b), float(t)) for b, t in points]
    if len(pts) < 2:
        raise ValueError(f"fitting {kind} on axis {axis}: need at least 2 measured sizes, got {len(pts)}")
    if rounds < 1:
        raise ValueError(f"fitting {kind} on axis {axis}: rounds must be >= 1, got {rounds}")
    bad = [(b, t) for b, t in pts if not (t > 0 and b >= 0)]
    if bad:
        raise ValueError(f"fitting {kind} on axis {axis}: every point needs bytes >= 0 and seconds > 0, "
                         f"got {bad}")
    sizes = np.array([b for b, _ in pts])
    times = np.array([t for _, t in pts])
    design = np.stack([np.full_like(sizes, float(rounds)), sizes], axis=1) / times[:, None]  # rows / t_i
    (alpha, per_byte), _ = nnls(design, np.ones_like(times))
    bandwidth = 1.0 / per_byte if per_byte > 1.0 / FREE_BANDWIDTH else FREE_BANDWIDTH
    predicted = alpha * rounds + sizes / bandwidth
    rel_error = float(np.median(np.abs(predicted - times) / times))
    return CommFit(kind=kind, axis=axis, group_size=group_size, alpha=float(alpha),
                   bandwidth=float(bandwidth), rel_error=rel_error)
