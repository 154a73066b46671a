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
    """One downsampled series: mean per bucket (NaN where no point fell)."""

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

    def put(self, metric: str, entity: str, t: float, v: float) -> None:
        if metric.startswith("step."):
            if metric not in STEP_FIELDS or entity.rsplit(":", 1)[0] not in self.jobs:
                return
        elif metric not in self.metrics:
            return
        i = self.grid.index(t)
        if i is None or not math.isfinite(v):
            return
        b = self.binned.get((metric, entity))
        if b is None:
            b = self.binned[(metric, entity)] = Binned(array("d", bytes(8 * self.grid.n)),
                                                        array("d", bytes(8 * self.grid.n)))
        b.sums[i] += v
        b.counts[i] += 1

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
