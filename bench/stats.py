"""Small statistics over samples, without numpy (linear interpolation, as numpy's default)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary_ms(samples_s: Sequence[float]) -> dict[str, Any]:
    """n, p50, p90, p99, median, mean, min, max in milliseconds, plus the samples (ms)."""
    ms = [s * 1000.0 for s in samples_s]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "median_ms": statistics.median(ms),
        "mean_ms": statistics.fmean(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "samples_ms": [round(v, 4) for v in ms],
    }
