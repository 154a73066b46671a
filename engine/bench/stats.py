"""The bench's figures from repeated measurements: pure functions, unit-tested.

Called by :mod:`whywait.engine.bench.harness` once every repetition of a size is done.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements and how far they strayed from it.

    ``rel`` is the larger distance from the median to the minimum or the maximum, relative to the
    median (0.08 means every run was within ±8 % of the median); NaN when the median is 0.
    """

    median: float
    low: float
    high: float
    n: int

    @property
    def rel(self) -> float:
        if self.n == 0 or self.median == 0:
            return math.nan
        return max(self.median - self.low, self.high - self.median) / abs(self.median)

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready: median, min, max, n and the relative spread."""
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n, "spread": self.rel}


def spread(values: Sequence[float]) -> Spread:
    """Median, minimum and maximum of ``values`` (NaN figures for an empty sequence)."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


def throughput_ratios(cpu_other: Sequence[float], cpu_raw: Sequence[float]) -> list[float]:
    """Per repetition, how fast ``other`` is relative to the raw floor, in messages per CPU-second.

    The same messages are read by both in a repetition, so the ratio of throughputs is
    ``cpu_raw / cpu_other``: 0.5 means the engine spends twice the CPU-seconds the raw consume
    does.  Repetitions are paired in order (they alternate, so each pair saw the same machine
    load); a repetition where either took no measurable CPU gives NaN.
    """
    if len(cpu_other) != len(cpu_raw):
        raise ValueError(f"paired repetitions expected (got {len(cpu_other)} and {len(cpu_raw)})")
    return [r / o if o > 0 and r > 0 else math.nan for o, r in zip(cpu_other, cpu_raw, strict=True)]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks; NaN when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100 (got {q})")
    vals = sorted(v for v in values if not math.isnan(v))
    if not vals:
        return math.nan
    k = (len(vals) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def cores_used(samples: Sequence[tuple[float, float]], skip_fraction: float = 0.5) -> float:
    """CPU cores used in steady state from ``(wall_s, cpu_s)`` samples of one process.

    The first ``skip_fraction`` of the samples (start-up, warming windows) is left out; the
    rest gives ``Δcpu / Δwall``.  NaN with fewer than two samples left.
    """
    tail = list(samples)[int(len(samples) * skip_fraction):]
    if len(tail) < 2 or tail[-1][0] <= tail[0][0]:
        return math.nan
    return (tail[-1][1] - tail[0][1]) / (tail[-1][0] - tail[0][0])
