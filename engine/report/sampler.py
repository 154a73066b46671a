"""The report's second pass over the window: the series the postmortem plots, downsampled, in bounded memory.

Called by :func:`whywait.engine.report.build_report` with the replayed messages once the
incidents are known, so it records only what the report shows: every rank's step time
and split for the jobs concerned, and each incident's evidence metrics for every entity
(the culprit and its peers).  Each series is a fixed number of buckets over the window
(sum and count per bucket), so memory depends on the cluster's size, never on the
length of the range.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any, Mapping

from whywait.engine.evaluate.store import MetricStore

STEP_FIELDS = ("step.duration_s", "step.data_wait_s", "step.compute_s", "step.comm_s")


@dataclass
class Grid:
    """``n`` equal buckets from ``t0`` to ``t1`` (event time)."""

    t0: float
    t1: float
    n: int = 480

    def __post_init__(self) -> None:
        # Buckets of at least 2 s, so second-scale steps land in every bucket (no gaps in the lines).
        self.n = max(1, min(self.n, int((self.t1 - self.t0) // 2)))

    @property
    def width(self) -> float:
        return (self.t1 - self.t0) / self.n

    def index(self, t: float) -> int | None:
        i = int((t - self.t0) // self.width)
        return i if 0 <= i < self.n else None

    def times(self) -> list[float]:
        """The centre of each bucket."""
        return [self.t0 + (i + 0.5) * self.width for i in range(self.n)]


@dataclass
class Binned:
    """One downsampled series: mean per bucket (NaN where no point fell); a step's point is weighted by the
    share of the bucket it spanned (:meth:`Sampler._spread`)."""

    sums: array[float]
    counts: array[float]

    def means(self) -> list[float]:
        return [s / c if c else math.nan for s, c in zip(self.sums, self.counts, strict=True)]


class Sampler(MetricStore):
    """A :class:`MetricStore` that keeps only the wanted metrics, binned on a :class:`Grid`.

    ``metrics`` are recorded for every entity; ``step.*`` only for ranks of ``jobs``.  The
    parent class does the decoding of each message into metrics (one definition of what a
    message measures); this class only changes where the points go.
    """

    def __init__(self, grid: Grid, metrics: set[str], jobs: set[str]) -> None:
        super().__init__(retention_s=0.0)
        self.grid = grid
        self.metrics = metrics
        self.jobs = jobs
        self.binned: dict[tuple[str, str], Binned] = {}
        self.placements: dict[str, Mapping[str, Any]] = {}  # job -> latest placement seen
        self._step_span: dict[str, tuple[float, float]] = {}  # rank -> (end, duration) of its step being read
        self.step_counts: dict[str, int] = {}  # rank -> steps read in the window (how much a quiet report says)

    def put(self, metric: str, entity: str, t: float, v: float) -> None:
        if metric.startswith("step."):
            if metric not in STEP_FIELDS or entity.rsplit(":", 1)[0] not in self.jobs:
                return
        elif metric not in self.metrics:
            return
        if not math.isfinite(v):
            return
        if metric.startswith("step."):
            # A step's figures hold over the time the step took, not at its end: a 600 s hang is drawn over
            # its 600 s, weighted by the time each bucket spent in it (averaged into the bucket where it
            # ended with the short steps after it, it was drawn 200 s high and 200 s long).
            if metric == "step.duration_s":
                self._step_span[entity] = (t, v)
                if self.grid.index(t) is not None:
                    self.step_counts[entity] = self.step_counts.get(entity, 0) + 1
            end, dur = self._step_span.get(entity, (t, 0.0))
            if end == t and dur > self.grid.width:
                self._spread(metric, entity, t - dur, t, v)
                return
        i = self.grid.index(t)
        if i is None:
            return
        b = self._bins(metric, entity)
        b.sums[i] += v
        b.counts[i] += 1

    def _bins(self, metric: str, entity: str) -> Binned:
        b = self.binned.get((metric, entity))
        if b is None:
            b = self.binned[(metric, entity)] = Binned(array("d", bytes(8 * self.grid.n)),
                                                        array("d", bytes(8 * self.grid.n)))
        return b

    def _spread(self, metric: str, entity: str, t0: float, t1: float, v: float) -> None:
        """Add ``v`` to every bucket ``[t0, t1]`` overlaps, weighted by the overlap (in bucket widths)."""
        g = self.grid
        w = g.width
        lo = max(0, int((t0 - g.t0) // w))
        hi = min(g.n - 1, int((t1 - g.t0) // w))
        if hi < lo:
            return
        b = self._bins(metric, entity)
        for i in range(lo, hi + 1):
            a = g.t0 + i * w
            part = (min(t1, a + w) - max(t0, a)) / w
            if part > 0:
                b.sums[i] += v * part
                b.counts[i] += part

    def ingest(self, msg: Mapping[str, Any]) -> float:
        if msg["kind"] == "placement":
            self.placements[msg["job"]] = msg
        t = super().ingest(msg)
        # job-level buckets and report times are the evaluator's business: drop them so nothing grows
        self._buckets.clear()
        self.node_seen.clear()
        return t

    def means(self, metric: str, entity: str) -> list[float] | None:
        b = self.binned.get((metric, entity))
        return b.means() if b is not None else None

    def entities(self, metric: str) -> list[str]:
        return sorted(e for m, e in self.binned if m == metric)
