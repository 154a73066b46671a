"""In-memory, event-time metric store fed by contract messages.

The evaluator calls :meth:`MetricStore.ingest` for every decoded message and
queries windows of it on each evaluation tick.  State is bounded by
``retention_s`` of event time.  Nothing here knows Kafka: the same store serves
the live engine, ``whywait rules test`` and replays.

Per-entity metrics (GPUs, NICs, devices, nodes, ranks) are kept in columns: per metric,
fixed-size numpy rings with a row per entity, 1 s slots for the recent window and 30 s buckets
over the retention (see :class:`Column`), so memory per entity does not grow with the time kept,
and conditions read an aggregate for every entity of a job in one call (:meth:`MetricStore.values`,
:meth:`MetricStore.ages`).  Job-level series and XID occurrences stay exact lists (:class:`Series`).

Entity keys are plain strings so they serialise compactly:
rank ``"<job>:<rank>"``, GPU ``"<node>/gpu<i>"``, NIC ``"<node>/<nic>"``,
block device or mount ``"<node>/<device>"`` (``node-03/nfs:/scratch``),
node ``"<node>"``, job ``"<job>"``.

Ingest walks the event contract's declarations (:func:`ingest_plan`): every field declared
with ``measure=`` in ``agents/events.py`` is stored per entity of its record (or per node), with
the node roll-ups it declares, so a new measured field needs no code here.  What no single field
gives (ratios, throttle reasons, the job's median over ranks, checkpoint spans, the hardware
report's summaries) is computed by the topic's derivation in :data:`DERIVATIONS`.
"""

from __future__ import annotations

import bisect
import logging
import math
import statistics
from array import array
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from whywait.agents import events
from whywait.engine.evaluate.steps import PHASES, StepRec, StepTable
from whywait.engine.rules.metrics import METRICS

# Metrics kept for the job retention (an hour): the job level's, by the catalogue, not by a "job." prefix; the
# checkpoint metrics are job level too, and a rule reading a save every 30 minutes needs them over the hour
# (they were cut at 15 minutes, so checkpoint.duration-growing's 1h window never held its 3 saves).
_JOB_LEVEL = frozenset(m.name for m in METRICS.values() if m.level == "job")

log = logging.getLogger(__name__)

THERMAL = {"hw_thermal_slowdown", "sw_thermal_slowdown"}
POWER = {"sw_power_cap", "hw_power_brake_slowdown"}
# The fields of a PCIe link the hw derivation reads, and the metrics it stores per GPU link (in order).
_PCIE_FIELDS = ("class", "gpu", "width", "width_max", "gen", "gen_max", "aer_correctable", "aer_nonfatal", "aer_fatal",
                "tx_bytes_per_s", "rx_bytes_per_s", "nics")
_PCIE_GPU_METRICS = ("gpu.pcie_width_ratio", "gpu.pcie_gen_ratio", "gpu.pcie_bandwidth_ratio", "gpu.pcie_width",
                     "gpu.pcie_gen", "gpu.pcie_lost", "gpu.pcie_aer_errors", "gpu.pcie_bytes_per_s")
_AGES = frozenset({"checkpoint.open_s", "step.since_last_s", "node.since_last_s"})
_JOB_FIELDS = ("duration_s", "data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s",
               "checkpoint_s")


@dataclass(frozen=True)
class _ListPlan:
    """How one list of a topic is stored: its entity, its measured fields and its node roll-ups."""

    name: str  # the list field ("gpus", "devices")
    entity: str  # gpu | nic | device | rank
    key: str  # the entry's field naming the entity
    direct: tuple[tuple[str, str, bool, bool], ...]  # (field, metric, boolean, one point per list entry)
    rollups: tuple[tuple[str, str, str], ...]  # (field, metric, "max" | "sum")

    @cached_property
    def reads(self) -> tuple[str, ...]:
        """The fields read from each entry: the key, the stored fields, then those only rolled up."""
        names = [self.key] + [d[0] for d in self.direct]
        return tuple(names + [r[0] for r in self.rollups if r[0] not in names])


@dataclass(frozen=True)
class KindPlan:
    """How the measured fields of one message kind are stored."""

    body: tuple[tuple[str, str, bool], ...]  # (field, metric, boolean): stored per node (or job)
    lists: tuple[_ListPlan, ...]
    per_job: bool = False  # a job topic: body fields are stored per job, not per node


def ingest_plan(topics: tuple[events.Topic, ...] | None = None) -> dict[str, KindPlan]:
    """Read the contract's ``measure=`` declarations into a plan per message kind.

    Called once at import for the contract (:data:`PLAN`), and by tests with a contract of their
    own.  ``topics`` defaults to :data:`whywait.agents.events.TOPICS`.
    """
    out: dict[str, KindPlan] = {}
    for t in events.TOPICS if topics is None else topics:
        body = tuple((f.name, f.measure.metric, f.type == "boolean") for f in t.body.fields
                     if f.measure is not None and f.measure.metric is not None)
        lists = []
        for name, rec in t.lists.items():
            ms = [(f, f.measure) for f in rec.fields if f.measure is not None]
            if not ms:
                continue
            # A declaration the store could not follow fails at import, naming the record and field.
            key = next((f for f in rec.fields if f.name == rec.entity_key), None)
            if rec.entity not in events.ENTITIES or key is None or not key.required:
                raise ValueError(f"{rec.name}: measured fields need entity= one of {', '.join(events.ENTITIES)} and "
                                 f"entity_key= a required field of the record (got {rec.entity!r}, "
                                 f"{rec.entity_key!r})")
            for f, m in ms:
                if any(r.how not in ("max", "sum") for r in m.rollups):
                    raise ValueError(f"{rec.name}.{f.name}: a rollup is 'max' or 'sum'")
            lists.append(_ListPlan(
                name, rec.entity, rec.entity_key,
                tuple((f.name, m.metric, f.type == "boolean", m.each) for f, m in ms if m.metric is not None),
                tuple((f.name, r.metric, r.how) for f, m in ms for r in m.rollups)))
        if body or lists:
            out[t.kind] = KindPlan(body, tuple(lists), t.key == "job id")
    return out


PLAN = ingest_plan()
# Kinds every node sends every interval (not steps, which a node sends only while a job runs there):
# a node's last report among these is its ``node.since_last_s``.
_NODE_PERIODIC = frozenset(t.kind for t in events.TOPICS if t.periodic and t.key == "node id")


def _entity(entity: str, msg: Mapping[str, Any], node: str, name: Any) -> str:
    if entity == "rank":
        return f"{msg['job']}:{name}"
    if entity == "gpu":
        return f"{node}/gpu{name}"
    return f"{node}/{name}"  # nic, device: the name as the agent gives it, under its node


class Series:
    """Time-ordered ``(t, value)`` points; appends are O(1) when in order, late points are inserted."""

    __slots__ = ("t", "v")

    def __init__(self) -> None:
        self.t: list[float] = []
        self.v: list[float] = []

    def add(self, t: float, v: float) -> None:
        if not self.t or t >= self.t[-1]:
            self.t.append(t)
            self.v.append(v)
        else:  # a late message: keep the series sorted
            i = bisect.bisect_right(self.t, t)
            self.t.insert(i, t)
            self.v.insert(i, v)

    def window(self, t0: float, t1: float) -> tuple[Sequence[float], Sequence[float]]:
        """Return the points with ``t0 < t <= t1`` as ``(times, values)``."""
        i = bisect.bisect_right(self.t, t0)
        j = bisect.bisect_right(self.t, t1)
        return self.t[i:j], self.v[i:j]

    def trim(self, before: float) -> None:
        i = bisect.bisect_left(self.t, before)
        if i:
            del self.t[:i]
            del self.v[:i]

    def last(self) -> float | None:
        return self.t[-1] if self.t else None


class Times:
    """Time-ordered event times (a node's reports): 8 bytes a time in an array, not a list of float objects.

    A node reports every second, and its report times are kept for the whole retention: as a
    :class:`Series` (two lists of Python floats) that was ~64 bytes a second per node, ~70 MiB at
    1,280 nodes over 900 s; here 8.
    """

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t: array[float] = array("d")

    def add(self, t: float) -> None:
        if not self.t or t >= self.t[-1]:
            self.t.append(t)
        else:  # a late message: keep the times sorted
            self.t.insert(bisect.bisect_right(self.t, t), t)

    def trim(self, before: float) -> None:
        i = bisect.bisect_left(self.t, before)
        if i:
            del self.t[:i]


def aggregate(agg: str, times: Sequence[float], values: Sequence[float]) -> float | None:
    """Reduce a window's points with ``agg``; None when the window is empty."""
    if not values:
        return None
    if agg == "avg":
        return math.fsum(values) / len(values)
    if agg == "max":
        return max(values)
    if agg == "min":
        return min(values)
    if agg == "sum":
        return math.fsum(values)
    if agg == "count":
        return float(len(values))
    if agg == "last":
        return values[-1]
    if agg == "median":
        return statistics.median(values)
    if agg in ("p90", "p95", "p99"):
        q = int(agg[1:]) / 100
        s = sorted(values)
        return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)]
    if agg in ("rate", "delta"):
        if len(values) < 2:
            return 0.0
        d = values[-1] - values[0]
        if agg == "delta":
            return d
        dt = times[-1] - times[0]
        return d / dt if dt > 0 else 0.0
    raise ValueError(f"unknown aggregation {agg!r}")


# ---- columnar series ----------------------------------------------------------------------------
#
# Per-entity telemetry (GPUs, NICs, devices, nodes, ranks) is most of the state: about 300 series per
# node, one point per second each.  Python lists of floats per series cost ~8 KiB per node per second
# kept, and a Python call per point.  Instead each metric is one :class:`Column`: numpy rings with a
# row per entity and fixed sizes, so memory per entity does not grow with retention:
#
# * a fine ring of ``fine_s`` one-second slots (sum and count per slot): exact for every window a
#   rule reads over recent data (the longest recent telemetry window in the shipped rules is 180 s);
# * a coarse ring of ``bucket_s`` buckets (sum and count) over the whole retention, for long
#   baselines: a window reaching past the fine ring reads the buckets for its older part (as one point
#   per bucket, its mean).  The buckets kept a float32 minimum and maximum too until nothing had read
#   them in eleven sessions: ~9% of the columns' memory and four numpy passes in every flush.
#
# A point at time ``t`` lands in slot ``ceil(t)``, the slot covering ``(s - 1, s]``, so a window
# ``(now - w, now]`` with whole-second ends (every tick's) holds exactly the points it held as a list.
# Two points in one slot (several steps of a rank in one message) are kept as their sum and count:
# sums, counts and means stay exact, and order statistics see the slot's mean.
#
# Writes are staged in plain lists (three appends per point) and applied to the rings in one
# vectorised pass before the next read, so ingest costs no numpy call per point.

# One-second slots in the fine ring (a power of two: positions are ``slot & mask``): 128 s covers every
# recent window the shipped rules read on telemetry; ranks keep 256 s (their 180 s change points and
# 300 s baselines read the most, and they are one row per GPU, not ~40).
_FINE_S = 128
_FINE_RANK_S = 256
_BUCKET_S = 30  # seconds per coarse bucket
# Told how long a window its rules read of each metric (``MetricStore.set_spans``), the store sizes a
# column's ring to that (at least ``_FINE_MIN`` slots) and drops its coarse ring when the fine one holds
# every window read: most GPU and node metrics are read over 5-60 s, and their 128 slots and 30 buckets
# were most of the memory at 10,240 GPUs.  The margin covers the seconds the newest point may be ahead
# of the tick reading it (points up to ``_AHEAD_S`` ahead are applied; the lateness; ``ceil``).
_FINE_MIN = 32
_SPAN_MARGIN_S = 32.0
_EMPTY = np.iinfo(np.int64).min // 2
# The count added per point, typed as the count arrays are: ``np.add.at`` with a Python int goes through
# numpy's casting loop and is about 8x slower on a uint16 array (1.2 ms against 0.16 for 8k points).
_ONE = np.uint16(1)
# Staged points a column holds at most before they are applied (bounds the staging lists' memory: ~72
# bytes a point with its floats, so every column no tick reads holds up to ~0.6 MiB; 1 << 15 was ~2.3 MiB,
# ~130 MiB over the shipped rules' columns at 1,280 nodes).  8,192 points are still one cheap numpy pass.
_STAGE_MAX = 1 << 13
# Points more than this far ahead of the evaluation clock stay staged (see ``Column.flush``): a consumer
# working through a backlog can read one topic minutes ahead of the others, and applying those points
# would move the rings past the seconds the next ticks read.  Up to ``_STAGE_HARD`` points wait so;
# beyond that a column applies everything (memory wins; counted in ``MetricStore.overruns``).
_AHEAD_S = 16.0
_STAGE_HARD = 1 << 20


class Rows:
    """Entity -> row number, shared by every column of one level (a GPU has one row in every GPU metric).

    Ingest then finds an entity's row once per list entry, not once per field.
    """

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.entity_of: list[str | None] = []
        self.free: list[int] = []
        self.version = 0  # counts the entities added and dropped (readers cache rows of entity lists on it)

    def add(self, entity: str) -> int:
        r = self.index.get(entity)
        if r is None:
            self.version += 1
            if self.free:
                r = self.free.pop()
                self.entity_of[r] = entity
            else:
                r = len(self.entity_of)
                self.entity_of.append(entity)
            self.index[entity] = r
        return r

    def drop(self, entity: str) -> int:
        self.version += 1
        r = self.index.pop(entity)
        self.entity_of[r] = None
        self.free.append(r)
        return r


# The kernel log's classes the hw topic counts per report, and their metrics (named once, not per message).
_KERNEL_CLASSES = ("mce", "pcie_aer", "pcie_aer_uncorrected", "xid", "gpu_lost", "nic_fw", "hung_task",
                   "soft_lockup", "fs_readonly", "fs_error", "io_error", "oom")
_KERNEL_METRICS = tuple(f"kernel.{c}" for c in _KERNEL_CLASSES)


class Column:
    """One metric's values for every entity of its level: a fine ring of 1 s slots and a coarse ring of buckets."""

    def __init__(self, rows: Rows, retention_s: float, fine_s: int = _FINE_S, bucket_s: int = _BUCKET_S,
                 coarse: bool = True) -> None:
        self.fine = fine_s
        self.mask = fine_s - 1
        assert fine_s & self.mask == 0, "fine_s is a power of two"
        self.bucket_s = bucket_s
        self.retention_s = retention_s
        # Without the coarse ring (``coarse`` False: no rule reads past the fine one) its arrays are
        # zero-width and ``cnewest`` stays empty, so reads and flushes see no bucket at all.
        self.coarse = coarse
        self.buckets = int(math.ceil(retention_s / bucket_s)) + 2 if coarse else 0
        self.shared = rows
        self.rows = rows.index
        self._alloc(max(16, len(rows.entity_of)))
        self.version = 0  # counts the flushes that applied points (readers' caches key on it)
        # staged points: row, time, value (appended by MetricStore, applied by flush before a read of this
        # column, or once ``_STAGE_MAX`` wait): a column no rule reads is applied in large batches
        self.s_row: list[int] = []
        self.s_t: list[float] = []
        self.s_v: list[float] = []
        # points ahead of the clock, waiting for it (see ``flush``): rows, times, values; and their earliest time
        self.held: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.held_from = math.inf
        # The newest slot that received a value other than 0 (NaN counts as other): error counters and
        # flags are 0 almost always, and a window after it needs no read at all (MetricStore.zero_in).
        self.nonzero_until = -math.inf

    def _alloc(self, rows: int) -> None:
        self.v = np.zeros((rows, self.fine), np.float64)
        self.n = np.zeros((rows, self.fine), np.uint16)
        self.newest = np.full(rows, _EMPTY, np.int64)  # newest slot written, per row
        self.cs = np.zeros((rows, self.buckets), np.float64)
        self.cn = np.zeros((rows, self.buckets), np.uint16)
        self.cnewest = np.full(rows, _EMPTY, np.int64)  # newest bucket written, per row

    def _fit(self) -> None:
        """Grow the arrays (doubling) to hold every row the level has handed out."""
        need = len(self.shared.entity_of)
        k = len(self.newest)
        if need <= k:
            return
        old: tuple[np.ndarray, ...] = (self.v, self.n, self.newest, self.cs, self.cn, self.cnewest)
        # grow by an eighth (at least 64 rows): doubling would leave up to half of a 10k-row column empty
        self._alloc(max(need, k + max(64, k // 8)))
        now: tuple[np.ndarray, ...] = (self.v, self.n, self.newest, self.cs, self.cn, self.cnewest)
        for new, prev in zip(now, old, strict=True):
            new[:k] = prev

    def resize(self, fine_s: int, coarse: bool) -> None:
        """Give the column a fine ring of ``fine_s`` slots, and a coarse ring if ``coarse``, keeping its points.

        Called by the store when a rule needs a longer window than the column was sized for (a rule
        loaded later, or a read past its ring).  Every slot both rings cover is copied; a new coarse
        ring is filled from the old fine ring's slots (their sums and counts are exact), so only what
        was older than the old ring is missing, as for a metric that starts being kept.
        """
        self._fit()
        old_v, old_n, old_fine, old_mask = self.v, self.n, self.fine, self.mask
        had_coarse = self.coarse
        old_cs, old_cn, old_cnewest = self.cs, self.cn, self.cnewest
        n_rows = len(self.newest)
        newest = self.newest.copy()
        self.fine, self.mask = fine_s, fine_s - 1
        self.coarse = coarse
        self.buckets = int(math.ceil(self.retention_s / self.bucket_s)) + 2 if coarse else 0
        self._alloc(n_rows)
        self.newest[:] = newest
        valid = np.nonzero(newest != _EMPTY)[0]
        self.version += 1
        if not len(valid):
            return
        r = valid[:, None]
        idx = newest[valid][:, None] - np.arange(old_fine)[None, :]  # every slot of the old ring, newest first
        shared = idx[:, :min(old_fine, fine_s)]
        self.v[r, shared & self.mask] = old_v[r, shared & old_mask]
        self.n[r, shared & self.mask] = old_n[r, shared & old_mask]
        if not coarse:
            return
        if had_coarse and old_cs.shape == self.cs.shape:
            self.cs[:], self.cn[:], self.cnewest[:] = old_cs, old_cn, old_cnewest
            return
        cnt = old_n[r, idx & old_mask]
        have = cnt > 0
        rr = np.broadcast_to(r, idx.shape)[have]
        b = (idx[have] - 1) // self.bucket_s
        self.cnewest[valid] = (newest[valid] - 1) // self.bucket_s
        np.add.at(self.cs, (rr, b % self.buckets), old_v[r, idx & old_mask][have])
        np.add.at(self.cn, (rr, b % self.buckets), cnt[have])

    def add(self, entity: str, t: float, v: float) -> None:
        r = self.rows.get(entity)
        self.s_row.append(self.shared.add(entity) if r is None else r)
        self.s_t.append(t)
        self.s_v.append(v)

    # ---- applying staged points -------------------------------------------------------------------

    def flush(self, upto: float | None = None) -> bool:
        """Apply the staged points to the rings (called before any read); return whether any stay staged.

        ``upto``: apply only the points at or before it and keep the later ones staged.  The rings hold
        ``fine_s`` seconds behind the newest slot written, so points far ahead of the seconds being
        evaluated (one topic read ahead of the others in a backlog) would push those seconds out of the
        fine ring before their ticks read them, and what a rule sees would depend on how the consumer's
        fetches interleaved the topics.  Kept back, they are applied when the clock reaches them.
        """
        self._fit()
        if not self.s_row and (self.held is None or (upto is not None and self.held_from > upto)):
            return self.held is not None  # nothing new, and what is held is still ahead of the clock
        times = np.asarray(self.s_t, np.float64)
        rows = np.asarray(self.s_row, np.int64)
        vals = np.asarray(self.s_v, np.float64)
        self.s_row, self.s_t, self.s_v = [], [], []
        if self.held is not None:
            rows, times, vals = (np.concatenate((h, x)) for h, x in zip(self.held, (rows, times, vals), strict=True))
            self.held = None
        later = times > upto if upto is not None else None
        if later is not None and later.any():
            # the rare case (a backlog read unevenly): the later points are held as arrays (24 bytes a
            # point, a third of the staging lists') until the clock reaches them
            self.held = (rows[later], times[later], vals[later])
            self.held_from = float(self.held[1].min())
            if later.all():
                return True
            now = ~later
            rows, times, vals = rows[now], times[now], vals[now]
        self.version += 1
        slots = np.ceil(times).astype(np.int64)
        nonzero = vals != 0
        if nonzero.any():
            self.nonzero_until = max(self.nonzero_until, float(slots[nonzero].max()))
        # The usual batch holds one point per row (one second of telemetry): plain fancy assignment is
        # then exact and several times faster than the unbuffered ``ufunc.at``.
        unique = bool(np.bincount(rows).max() == 1)
        self._advance(rows, slots, self.newest, self.fine, (self.v, self.n), unique)
        keep = slots > self.newest[rows] - self.fine  # older than the fine ring: the buckets only
        r, pos, x = rows[keep], slots[keep] & self.mask, vals[keep]
        if unique:
            self.v[r, pos] += x
            self.n[r, pos] += 1
        else:
            np.add.at(self.v, (r, pos), x)
            np.add.at(self.n, (r, pos), _ONE)
        if not self.coarse:
            return self.held is not None
        b = (slots - 1) // self.bucket_s
        self._advance(rows, b, self.cnewest, self.buckets, (self.cs, self.cn), unique)
        keep = b > self.cnewest[rows] - self.buckets
        r, b, x = rows[keep], b[keep] % self.buckets, vals[keep]
        if unique:
            self.cs[r, b] += x
            self.cn[r, b] += 1
        else:
            np.add.at(self.cs, (r, b), x)
            np.add.at(self.cn, (r, b), _ONE)
        return self.held is not None

    @staticmethod
    def _advance(rows: np.ndarray, idx: np.ndarray, newest: np.ndarray, size: int,
                 arrays: tuple[np.ndarray, ...], unique: bool) -> None:
        """Move each row's newest index to its newest staged one, emptying the ring positions it passes."""
        if unique:
            ahead = idx > newest[rows]
            moved, to = rows[ahead], idx[ahead]
            if not len(moved):
                return
            step = to - newest[moved]
            if int(step.max()) == 1:  # the usual second: each row moves on by one slot
                for a in arrays:
                    a[moved, to % size] = 0
                newest[moved] = to
                return
            top = np.empty(len(newest), np.int64)
            top[moved] = to
        else:
            top = np.full(len(newest), _EMPTY, np.int64)
            np.maximum.at(top, rows, idx)
            moved = np.nonzero(top > newest)[0]
        if not len(moved):
            return
        step = top[moved] - newest[moved]
        # A row never written (or cleared) is all zeros already (``_alloc``, ``clear``): zeroing it again
        # cost a whole ring per row on each column's first flush.
        whole = moved[(step >= size) & (newest[moved] != _EMPTY)]
        if len(whole):
            for a in arrays:
                a[whole] = 0
        part = moved[step < size]
        if len(part):
            old = newest[part]
            gap = top[part] - old
            for k in range(1, int(gap.max()) + 1):
                sel = gap >= k
                p = (old[sel] + k) % size
                for a in arrays:
                    a[part[sel], p] = 0
        newest[moved] = top[moved]

    # ---- reading -----------------------------------------------------------------------------------

    def points(self, r: int, t0: float, t1: float) -> tuple[list[float], list[float]]:
        """Row ``r``'s points with ``t0 < t <= t1``: one per non-empty slot (its mean), older ones per bucket."""
        self._fit()
        newest = int(self.newest[r])
        hi = min(math.floor(t1), newest)
        lo = math.floor(t0) + 1
        if hi < lo:
            return [], []
        fine_lo = newest - self.fine + 1
        times: list[float] = []
        vals: list[float] = []
        if lo < fine_lo:  # the older part, from the buckets that end before the fine ring starts
            bs = self.bucket_s
            cnew = int(self.cnewest[r])
            b_lo = max((lo - 1) // bs, cnew - self.buckets + 1)
            b_hi = min((fine_lo - 1) // bs - 1, (hi - 1) // bs, cnew)
            if b_hi >= b_lo:
                idx = np.arange(b_lo, b_hi + 1)
                pos = idx % self.buckets
                cnt = self.cn[r, pos]
                ok = cnt > 0
                times += ((idx[ok] + 1) * bs).astype(np.float64).tolist()
                vals += (self.cs[r, pos][ok] / cnt[ok]).tolist()
                lo = (b_hi + 1) * bs + 1
            lo = max(lo, fine_lo)
        if hi >= lo:
            idx = np.arange(lo, hi + 1)
            pos = idx & self.mask
            cnt = self.n[r, pos]
            ok = cnt > 0
            times += idx[ok].astype(np.float64).tolist()
            vals += (self.v[r, pos][ok] / cnt[ok]).tolist()
        return times, vals

    def counts(self, r: int, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """Row ``r``'s fine slots at or before ``t1``, newest first, and the number of points in each."""
        self._fit()
        hi = min(math.floor(t1), int(self.newest[r]))
        idx = np.arange(hi, int(self.newest[r]) - self.fine, -1)
        return idx, self.n[r, idx & self.mask]

    def last(self, r: int, t1: float) -> float | None:
        """The time (slot) of row ``r``'s newest point at or before ``t1``."""
        idx, cnt = self.counts(r, t1)
        nz = np.nonzero(cnt)[0]
        if len(nz):
            return float(idx[nz[0]])
        return None

    def matrix(self, rows: np.ndarray, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The fine slots of ``rows`` in ``(t0, t1]``: slot times, values (NaN where empty), counts.

        None when the window reaches past any row's fine ring (the caller reads those row by row).
        """
        self._fit()
        hi = math.floor(t1)
        lo = math.floor(t0) + 1
        newest = self.newest[rows]
        valid_rows = newest != _EMPTY
        if valid_rows.any():
            top = int(newest[valid_rows].max())
            if lo <= top - self.fine:
                return None
            # Slots after every row's newest point are empty for this window: leave them out.  A window wider
            # than the ring whose rows all stopped long ago (a finished job's ranks, read by a rule that looks
            # back a number of steps) had its columns wrap onto themselves, and the rule raised.
            hi = min(hi, top)
        else:
            hi = lo - 1  # no row has any point
        if hi < lo:
            return np.zeros(0), np.full((len(rows), 0), np.nan), np.zeros((len(rows), 0), np.uint16)
        idx = np.arange(lo, hi + 1)
        pos = idx & self.mask
        cnt = self._cols(self.n, rows, int(pos[0]), len(pos))
        v = self._cols(self.v, rows, int(pos[0]), len(pos))
        # a slot beyond a row's newest holds an old second's data (not yet overwritten): empty for this window
        stale = (idx[None, :] > newest[:, None]) | (idx[None, :] <= newest[:, None] - self.fine)
        if stale.any():
            cnt[stale] = 0
        with np.errstate(invalid="ignore", divide="ignore"):
            vals = v / cnt
        vals[cnt == 0] = np.nan
        return idx.astype(np.float64), vals, cnt

    def _cols(self, a: np.ndarray, rows: np.ndarray, start: int, length: int) -> np.ndarray:
        """``a[rows]`` at ring positions ``start .. start + length`` (wrapping): a slice of columns, then the rows
        (far cheaper than a 2-D fancy index)."""
        end = start + length
        lo = int(rows[0]) if len(rows) else 0
        if len(rows) and int(rows[-1]) - lo == len(rows) - 1 and (len(rows) < 2 or bool((np.diff(rows) == 1).all())):
            a = a[lo:lo + len(rows)]  # consecutive rows (a job holding a whole level): a slice, no gather
            rows = slice(None)  # type: ignore[assignment]
        if end <= self.fine:
            out: np.ndarray = a[:, start:end][rows]
            return out
        return np.concatenate((a[:, start:][rows], a[:, :end - self.fine][rows]), axis=1)

    def clear(self, r: int | np.ndarray) -> None:
        """Empty row ``r``, or the rows of an array of them (their entities were dropped from the level)."""
        if isinstance(r, np.ndarray):
            r = r[r < len(self.newest)]
        elif r >= len(self.newest):
            return
        for a in (self.v, self.n, self.cs, self.cn):
            a[r] = 0
        self.newest[r] = _EMPTY
        self.cnewest[r] = _EMPTY

    def nbytes(self) -> int:
        held = sum(a.nbytes for a in self.held) if self.held is not None else 0
        return held + sum(a.nbytes for a in (self.v, self.n, self.newest, self.cs, self.cn, self.cnewest))


def aggregate_rows(agg: str, times: np.ndarray, vals: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """``agg`` of each row of a window matrix (NaN where a row has no point): :func:`aggregate`, vectorised.

    ``vals`` holds each slot's mean (NaN when empty) and ``cnt`` its number of points, so sums, counts
    and means count every point.
    """
    k = cnt.sum(axis=1).astype(np.float64)
    have = (cnt > 0).sum(axis=1)
    out = np.full(vals.shape[0], np.nan)
    ok = have > 0
    if not ok.any():
        return out
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if agg in ("avg", "sum"):
            s = np.nansum(np.where(cnt > 0, vals * cnt, 0.0), axis=1)
            out[ok] = (s / k)[ok] if agg == "avg" else s[ok]
        elif agg == "count":
            out[ok] = k[ok]
        elif agg == "max":
            out[ok] = np.nanmax(vals[ok], axis=1)
        elif agg == "min":
            out[ok] = np.nanmin(vals[ok], axis=1)
        elif agg in ("last", "rate", "delta"):
            n = vals.shape[1]
            last_i = n - 1 - np.argmax((cnt > 0)[:, ::-1], axis=1)
            first_i = np.argmax(cnt > 0, axis=1)
            r = np.arange(len(out))
            lastv, firstv = vals[r, last_i], vals[r, first_i]
            if agg == "last":
                out[ok] = lastv[ok]
            else:
                d = np.where(have >= 2, lastv - firstv, 0.0)
                if agg == "delta":
                    out[ok] = d[ok]
                else:
                    dt = times[last_i] - times[first_i] if n else np.zeros(len(out))
                    out[ok] = np.where(dt > 0, d / np.where(dt > 0, dt, 1.0), 0.0)[ok]
        elif agg == "median":  # (np.nanmedian falls back to masked arrays on short rows: slow)
            srt = np.sort(vals[ok], axis=1)  # NaN last
            m = have[ok]
            i = np.arange(len(m))
            out[ok] = (srt[i, (m - 1) // 2] + srt[i, m // 2]) / 2
        elif agg in ("p90", "p95", "p99"):
            q = int(agg[1:]) / 100
            s = np.sort(vals[ok], axis=1)  # NaN last
            m = have[ok]
            i = np.minimum(m - 1, np.ceil(q * m).astype(np.int64) - 1)
            out[ok] = s[np.arange(len(m)), i]
        else:
            raise ValueError(f"unknown aggregation {agg!r}")
    return out


# The metrics kept in columns: every per-entity metric except occurrences (an XID's code is its value,
# one point per occurrence: summing them would lose the codes) and the ages (computed, not stored).
# Job-level series (a point per job per second, kept an hour) stay exact :class:`Series`.
COLUMNAR: frozenset[str] = frozenset(m.name for m in METRICS.values()
                                     if m.level in ("gpu", "node", "nic", "device", "rank") and not m.occurrences
                                     and m.name not in _AGES)


class MetricStore:
    """Every metric of :mod:`whywait.engine.rules.metrics`, per entity, over the last ``retention_s``."""

    def __init__(self, retention_s: float = 900.0, plan: dict[str, KindPlan] | None = None) -> None:
        self.retention_s = retention_s
        self.plan = PLAN if plan is None else plan
        self._series: dict[tuple[str, str], Series] = {}  # the exact series: job level and occurrences
        self.columns: dict[str, Column] = {}  # the columnar ones, by metric
        self.levels: dict[str, Rows] = {}  # level -> its entities' rows, shared by the level's columns
        self._staged: set[Column] = set()  # columns with points not yet applied to their rings
        # The evaluation clock: the event time of the last tick (set by :meth:`close_buckets`, or by the
        # evaluator before its first tick).  Points beyond it + ``_AHEAD_S`` wait in the staging lists.
        self.clock: float | None = None
        self.overruns = 0  # columns that had to apply points far ahead of the clock (staging full)
        self._memo: dict[tuple[Any, ...], np.ndarray] = {}  # values() results of the tick at _memo_now
        self._memo_now = math.nan
        self.node_last: dict[str, float] = {}
        # level -> node -> entity keys seen, for the levels a job's placement does not name (NICs,
        # block devices and mounts): a condition at that level judges the entities of the job's nodes.
        self.members: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self.nics: dict[str, set[str]] = self.members["nic"]  # node -> NIC entity keys seen
        self.nic_gpus: dict[str, tuple[int, ...]] = {}  # NIC entity key -> GPUs it serves
        self.open_checkpoints: dict[tuple[str, str], float] = {}  # (job, checkpoint id) -> start time
        # job -> checkpoint id -> [start, end or None]: ages are judged at the evaluation time, which
        # trails the newest message by the lateness, so a save that ended "later" was still open then.
        self.checkpoint_spans: dict[str, dict[str, list[float | None]]] = defaultdict(dict)
        self.node_seen: dict[str, Times] = {}  # node -> times it reported (any periodic kind)
        self.first_report_t: float | None = None  # the first node report's event time (telemetry_since)
        self._reported_memo: tuple[tuple[float, float], tuple[int, int]] | None = None  # reporting's last answer
        # Job-level metrics are the median over ranks per second of event time: steps land in
        # per-second buckets that are closed (reduced to their median) once the watermark passes.
        self._buckets: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(dict)
        self.max_time = float("-inf")
        # job -> its last steps, rank by rank, for the step-aligned conditions (engine.evaluate.steps)
        self.step_tables: dict[str, StepTable] = {}
        # Job-level series are one point per job per second: keeping an hour of them costs little and
        # lets a periodic slowdown (every few minutes) show several periods.
        self.job_retention_s = max(retention_s, 3600.0)
        # (level, node or job, entry names) -> the entries' entity keys and rows (see ``_entities``)
        self._ents: dict[tuple[str, str, tuple[Any, ...]], tuple[list[str], list[int] | None]] = {}
        self._levels_stored = frozenset(METRICS[m].level for m in COLUMNAR)
        # Points go straight to the columns, unless a subclass (the report's sampler) routes them through put().
        self._direct = type(self).put is MetricStore.put
        # (level's rows, entity list) -> (the level's version, their rows): see ``rows_of``
        self._rows_memo: dict[tuple[int, tuple[str, ...]], tuple[int, np.ndarray]] = {}
        self._by_metric: dict[str, dict[str, Series]] = defaultdict(dict)  # the exact series, by metric
        # The metrics stored (None: every one); see ``set_keep``.  Per list plan, what of it is kept.
        self._keep: frozenset[str] | None = None
        # The longest window the rules read per metric (None: unknown, every column keeps full rings);
        # see ``set_spans``.
        self._spans: dict[str, float] | None = None
        self._kept_lists: dict[int, tuple[tuple[str, ...], tuple[tuple[str, str, bool, bool], ...],
                                          tuple[tuple[str, str, str], ...]]] = {}
        # Per kind plan, its body fields that are kept (a third of a node's body fields are read by no rule).
        self._kept_body: dict[int, tuple[tuple[str, str, bool], ...]] = {}
        self._job_fields: tuple[bool, ...] = (True,) * len(_JOB_FIELDS)
        self._shares: tuple[bool, ...] = (True,) * 3

    # ---- writing ----------------------------------------------------------------------------------

    @property
    def keep(self) -> frozenset[str] | None:
        """The metrics this store keeps; None: every metric of the catalogue."""
        return self._keep

    def set_keep(self, metrics: Iterable[str] | None) -> None:
        """Keep only ``metrics`` from now on (None: all): called by the evaluator with what its rules read.

        Most of a message's fields are read by no rule (an NVLink counter, a NIC's drop rate); storing
        them cost most of ingest.  Step tables, node reports and placements are kept regardless.  A read
        of a metric not kept adds it (and logs it): its window then fills from the next message on.
        """
        self._keep = None if metrics is None else frozenset(metrics)
        self._kept_lists.clear()
        self._kept_body.clear()
        keep = self._keep
        self._job_fields = tuple(keep is None or f"job.{f}" in keep for f in _JOB_FIELDS)
        self._shares = tuple(keep is None or f"job.{f}" in keep for f in ("data_wait_share", "comm_share",
                                                                          "compute_share"))

    def set_spans(self, spans: Mapping[str, float] | None) -> None:
        """Size each column to the longest window read of its metric (None: full rings for every metric).

        Called by the evaluator with :func:`whywait.engine.evaluate.evaluator.rule_spans` of its rules,
        beside :meth:`set_keep`.  A metric without a span (read by code, or over a number of steps)
        keeps full rings; a column already too small for its new span grows (:meth:`Column.resize`).
        """
        self._spans = None if spans is None else dict(spans)
        for metric, col in self.columns.items():
            fine, coarse = self._shape(metric)
            if fine > col.fine or (coarse and not col.coarse):
                col.resize(max(fine, col.fine), coarse or col.coarse)

    def _shape(self, metric: str) -> tuple[int, bool]:
        """The fine ring's slots and whether a coarse ring is kept, for a new column of ``metric``."""
        level = METRICS[metric].level
        if level == "rank":  # step windows are counted in steps too: they reach as far as the steps are long
            return _FINE_RANK_S, True
        span = None if self._spans is None else self._spans.get(metric)
        if span is None or span + _SPAN_MARGIN_S > _FINE_S:
            return _FINE_S, True
        return max(_FINE_MIN, 1 << math.ceil(math.log2(span + _SPAN_MARGIN_S))), False

    def _reach(self, col: Column, metric: str, window_s: float) -> None:
        """Called by every windowed read: a window longer than a column without a coarse ring holds grows it.

        Rules say their windows up front (``set_spans``), so this is for a window nothing declared
        (a site rule's read the spans missed): logged, and kept from then on.
        """
        if col.coarse or window_s + _SPAN_MARGIN_S <= col.fine:
            return
        log.warning("metric %s was read over %.0fs, longer than its ring (%d s): widening it", metric, window_s,
                    col.fine)
        if self._spans is not None:
            self._spans[metric] = max(self._spans.get(metric, 0.0), window_s)
        fine, coarse = self._shape(metric)
        col.resize(max(fine, col.fine), coarse)

    def _read(self, metric: str) -> None:
        """Called by every read: a metric the store was told not to keep is kept from now on."""
        if self._keep is not None and metric not in self._keep and metric not in _AGES:
            log.warning("metric %s was read but not kept (no loaded rule names it): keeping it from now on", metric)
            self.set_keep(self._keep | {metric})

    def put(self, metric: str, entity: str, t: float, v: float) -> None:
        """Store one point of ``metric`` for ``entity`` at event time ``t`` (staged until the next read)."""
        if self._keep is not None and metric not in self._keep:
            return
        col = self.columns.get(metric)
        if col is None and metric in COLUMNAR:
            col = self.column(metric)
        if col is not None:  # inlined Column.add: this runs for every derived point
            r = col.rows.get(entity)
            col.s_row.append(col.shared.add(entity) if r is None else r)
            col.s_t.append(t)
            col.s_v.append(v)
            self._staged.add(col)
            if len(col.s_row) > _STAGE_MAX:
                self._relieve(col)
            return
        s = self._series.get((metric, entity))
        if s is None:
            s = self._series[(metric, entity)] = Series()
            self._by_metric[metric][entity] = s
        s.add(t, v)

    def column(self, metric: str) -> Column:
        """The column of a metric in :data:`COLUMNAR`, made on first use."""
        col = self.columns.get(metric)
        if col is None:
            level = METRICS[metric].level
            rows = self.levels.get(level)
            if rows is None:
                rows = self.levels[level] = Rows()
            fine, coarse = self._shape(metric)
            col = self.columns[metric] = Column(rows, self.retention_s, fine, coarse=coarse)
        return col

    def _upto(self) -> float | None:
        return None if self.clock is None else self.clock + _AHEAD_S

    def _relieve(self, col: Column) -> None:
        """A column's staging lists passed their limit: apply what the clock allows (all, past ``_STAGE_HARD``)."""
        if col.flush(self._upto()) and col.held is not None and len(col.held[0]) > _STAGE_HARD:
            self.overruns += 1
            col.flush()

    def flush(self, everything: bool = False) -> None:
        """Apply the staged points up to the clock (``everything``: all of them); every read calls it first."""
        if self._staged:
            upto = None if everything else self._upto()
            self._staged = {col for col in self._staged if col.flush(upto)}

    @property
    def series(self) -> SeriesView:
        """Every series as ``(metric, entity) -> Series`` (a read-only view: columns materialise on access)."""
        self.flush()
        return SeriesView(self)

    def memory_bytes(self) -> int:
        """Bytes held by the columns' arrays (the bulk of the store at scale), points waiting for the clock included.

        Read when ``/metrics`` is scraped: it applies the staged points only up to the clock.
        """
        self.flush()
        return sum(c.nbytes() for c in self.columns.values())

    def ingest(self, msg: Mapping[str, Any]) -> float:
        """Add one validated contract message; return its event time."""
        t = float(msg["time"])
        if t > self.max_time:
            self.max_time = t
        kind = msg["kind"]
        node = msg["node"]
        if kind in _NODE_PERIODIC:
            if self.first_report_t is None or t < self.first_report_t:
                self.first_report_t = t
            self.node_last[node] = max(t, self.node_last.get(node, t))
            seen = self.node_seen.get(node)
            if seen is None:
                seen = self.node_seen[node] = Times()
            if not seen.t or seen.t[-1] != t:
                seen.add(t)
        plan = self.plan.get(kind)
        if plan is not None:
            self._ingest_declared(plan, msg, t, node)
        derive = DERIVATIONS.get(kind)
        if derive is not None:
            derive(self, msg, t, node)
        return t

    def _ingest_declared(self, plan: KindPlan, msg: Mapping[str, Any], t: float, node: str) -> None:
        """Store every field the contract declares measured, and the node roll-ups it declares.

        The hot path of ingest (one point per field per list entry).  Per list, the fields are read
        column by column (:func:`whywait.agents.events.columns`), the entries' rows come from a cache
        keyed by the list's entity names (:meth:`_entities`), and each field's values are appended to
        its column's staging lists in one call: no Python call per point.
        """
        put = self.put
        owner = msg["job"] if plan.per_job else node
        body = self._kept_body.get(id(plan))
        if body is None:
            keep = self._keep
            body = self._kept_body[id(plan)] = tuple(b for b in plan.body if keep is None or b[1] in keep)
        for name, metric, boolean in body:
            v = msg.get(name)
            if v is not None:
                put(metric, owner, t, (1.0 if v else 0.0) if boolean else float(v))
        for lp in plan.lists:
            items = msg.get(lp.name)
            kept = self._kept_lists.get(id(lp))
            if kept is None:
                kept = self._kept_lists[id(lp)] = self._kept_list(lp)
            reads, direct, rolled = kept
            if not items:
                if items is not None and rolled:
                    self._rollups(rolled, {}, t, node)
                continue
            if len(reads) == 1 and lp.entity not in ("nic", "device"):
                continue  # nothing of this list is kept (NICs and devices still register as the node's)
            cols = dict(zip(reads, events.columns(items, reads), strict=True))
            ents, rows = self._entities(lp.entity, msg, node, cols[lp.key])
            for name, metric, boolean, each in direct:
                vs = cols[name]
                if each:  # one point per occurrence: a repeated XID counts twice
                    for e, v in zip(ents, vs, strict=True):
                        if v is not None:
                            for x in v:
                                put(metric, e, t, float(x))
                else:
                    self.put_many(metric, lp.entity, ents, rows, t, vs, boolean)
            if rolled:
                self._rollups(rolled, cols, t, node)

    def _kept_list(self, lp: _ListPlan) -> tuple[tuple[str, ...], tuple[tuple[str, str, bool, bool], ...],
                                                 tuple[tuple[str, str, str], ...]]:
        """What of a list's plan the store keeps: the fields to read (key first), the stored ones, the roll-ups."""
        keep = self._keep
        if keep is None:
            return lp.reads, lp.direct, lp.rollups
        direct = tuple(d for d in lp.direct if d[1] in keep)
        rolled = tuple(r for r in lp.rollups if r[1] in keep)
        names = [lp.key] + [d[0] for d in direct]
        names += [r[0] for r in rolled if r[0] not in names]
        return tuple(names), direct, rolled

    def _entities(self, level: str, msg: Mapping[str, Any], node: str, names: Sequence[Any]
                  ) -> tuple[list[str], list[int] | None]:
        """The entity keys of a list's entries (``names``: their key field) and their rows at ``level``.

        Cached by (level, node or job, names): a node sends the same GPUs and NICs every second, so
        each entry's key string and row are built once, not once per message.  The cache is emptied
        when a row is freed (:meth:`trim`).  Rows are None while the level has no column yet.
        """
        key = (level, msg["job"] if level == "rank" else node, tuple(names))
        hit = self._ents.get(key)
        if hit is not None:
            return hit
        ents = [_entity(level, msg, node, n) for n in names]
        if level in ("nic", "device"):
            self.members[level][node].update(ents)
        rows = self.levels.get(level)
        if rows is None and level in self._levels_stored:  # the level's columns (made later) share these rows
            rows = self.levels[level] = Rows()
        out = (ents, [rows.add(e) for e in ents] if rows is not None else None)
        if rows is not None:
            if len(self._ents) >= 1 << 16:  # bounded: a churn of node or job names cannot grow it
                self._ents.clear()
            self._ents[key] = out
        return out

    def put_many(self, metric: str, level: str, ents: Sequence[str], rows: Sequence[int] | None, t: float,
                 values: Sequence[Any], boolean: bool = False) -> None:
        """Store ``values[i]`` for ``ents[i]`` at ``t`` (None: no point), ``rows`` their rows at ``level``.

        :meth:`put` for a whole list at once: the points go to the column's staging lists in three
        list extensions.  Numbers are kept as given (ints and bools become floats when applied).
        """
        if self._keep is not None and metric not in self._keep:
            return
        col = self.columns.get(metric)
        if col is None and metric in COLUMNAR:
            col = self.column(metric)
        if col is None or rows is None or not self._direct or col.shared is not self.levels.get(level):
            put = self.put
            for e, v in zip(ents, values, strict=True):
                if v is not None:
                    put(metric, e, t, (1.0 if v else 0.0) if boolean else float(v))
            return
        if boolean:
            values = [None if v is None else (1.0 if v else 0.0) for v in values]
        if None in values:
            keep = [i for i, v in enumerate(values) if v is not None]
            if not keep:
                return
            rows = [rows[i] for i in keep]
            values = [values[i] for i in keep]
        col.s_row += rows
        col.s_t += [t] * len(rows)
        col.s_v += values
        self._staged.add(col)
        if len(col.s_row) > _STAGE_MAX:
            self._relieve(col)

    def _rollups(self, rollups: tuple[tuple[str, str, str], ...], cols: Mapping[str, Sequence[Any]], t: float,
                 node: str) -> None:
        """The node roll-ups of one list (those kept): the ``max`` or ``sum`` of a field over its entries (``cols``)."""
        for name, metric, how in rollups:
            vals = [float(v) for v in cols.get(name, ()) if v is not None]
            if how == "sum":  # an empty list, or entries without the field, add nothing: 0
                self.put(metric, node, t, math.fsum(vals))
            elif vals:
                self.put(metric, node, t, max(vals))

    # ---- derivations: what no single declared field gives -----------------------------------------

    def _derive_gpu(self, msg: Mapping[str, Any], t: float, node: str) -> None:
        gpus = msg["gpus"]
        if not gpus:
            return
        idx, clock, clock_max, power, limit, reasons = events.columns(
            gpus, ("gpu", "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "throttle_reasons"))
        ents, rows = self._entities("gpu", msg, node, idx)
        many = self.put_many
        many("gpu.sm_clock_ratio", "gpu", ents, rows, t,
             [c / m if m else None for c, m in zip(clock, clock_max, strict=True)])
        many("gpu.power_ratio", "gpu", ents, rows, t, [w / m if m else None for w, m in zip(power, limit, strict=True)])
        many("gpu.thermal_throttle", "gpu", ents, rows, t,
             [1.0 if r and not THERMAL.isdisjoint(r) else 0.0 for r in reasons])
        many("gpu.power_throttle", "gpu", ents, rows, t,
             [1.0 if r and not POWER.isdisjoint(r) else 0.0 for r in reasons])

    def _derive_net(self, msg: Mapping[str, Any], t: float, node: str) -> None:
        put = self.put
        retrans, out = msg["tcp_retrans_segs_per_s"], msg["tcp_out_segs_per_s"]
        put("net.tcp_retrans_ratio", node, t, retrans / out if out > 0 else 0.0)
        down = 0
        tx: list[float] = []
        for n in msg["nics"]:
            if n.get("gpus"):
                self.nic_gpus[f"{node}/{n['nic']}"] = tuple(n["gpus"])
            down += 0 if n["link_up"] else 1
            tx.append(n["tx_bytes_per_s"])
        put("net.links_down", node, t, float(down))
        mean_tx = sum(tx) / len(tx) if tx else 0.0
        put("net.tx_imbalance", node, t, max(tx) / mean_tx if mean_tx > 0 else 1.0)

    def _derive_host(self, msg: Mapping[str, Any], t: float, node: str) -> None:
        if msg["mem_total_bytes"]:
            self.put("host.mem_used_pct", node, t, 100.0 * msg["mem_used_bytes"] / msg["mem_total_bytes"])

    def _derive_hw(self, msg: Mapping[str, Any], t: float, node: str) -> None:
        """Hardware health (the ``hw`` topic): each list present sets its metrics; an absent list says nothing."""
        put = self.put
        # Per-lane PCIe rate in Gb/s after encoding, by generation (Gen1-2: 8b/10b; Gen3-5: 128b/130b;
        # Gen6 FLIT): a link's bandwidth is width × this.  Kept here so this method stays self-contained.
        lane = {1: 2.0, 2: 4.0, 3: 7.877, 4: 15.754, 5: 31.508, 6: 60.5}

        def _lane_gbps(gen: int) -> float:
            return lane.get(gen, 0.0)

        kernel_classes = _KERNEL_CLASSES
        # Hardware classes for kernel.hw_errors; corrected AER (routine in small numbers), XIDs (the GPU
        # rules read them from NVML), hung tasks, lockups and OOM (symptoms, not hardware) stay out.
        kernel_hw = ("mce", "pcie_aer_uncorrected", "gpu_lost", "nic_fw", "fs_readonly", "fs_error", "io_error")
        degraded = 0
        links = msg.get("pcie") or ()
        # GPU links: each metric's values over the GPUs, stored per list (put_many)
        gpu_of: list[Any] = []
        per_gpu: dict[str, list[float | None]] = {m: [] for m in _PCIE_GPU_METRICS}
        for (cls, gpu, width, width_max, gen, gen_max, aer_c, aer_n, aer_f, tx, rx, nics) in zip(
                *events.columns(links, _PCIE_FIELDS), strict=True):
            lost = width == 0
            ratios = (width / width_max if width_max else 1.0,
                      gen / gen_max if gen_max else 1.0,
                      _lane_gbps(gen) * width / (_lane_gbps(gen_max) * width_max)
                      if width_max and _lane_gbps(gen_max) else 1.0)
            if cls == "gpu" and gpu is not None:
                gpu_of.append(gpu)
                for m, v in zip(_PCIE_GPU_METRICS, (
                        *ratios, float(width), float(gen), 1.0 if lost else 0.0,
                        float(sum(x or 0 for x in (aer_c, aer_n, aer_f))),
                        float((tx or 0.0) + (rx or 0.0)) if tx is not None or rx is not None else None), strict=True):
                    per_gpu[m].append(v)
                continue
            if lost or ratios[0] < 1.0 or ratios[1] < 1.0:
                degraded += 1
            for nic in nics or ():
                e = f"{node}/{nic}"
                self.nics[node].add(e)
                for name, v in zip(("nic.pcie_width_ratio", "nic.pcie_gen_ratio", "nic.pcie_bandwidth_ratio"),
                                   ratios, strict=True):
                    put(name, e, t, v)
                put("nic.pcie_lost", e, t, 1.0 if lost else 0.0)
        if gpu_of:
            ents, rows = self._entities("gpu", msg, node, gpu_of)
            for m, vs in per_gpu.items():
                self.put_many(m, "gpu", ents, rows, t, vs)
        if msg.get("pcie") is not None:
            put("node.pcie_links_degraded", node, t, float(degraded))
        ports = msg.get("ports")
        if ports is not None:
            # Ports of one adapter model and link layer should negotiate one speed: compare each with the
            # fastest of its kind on the node (sysfs does not say what a port supports).
            fastest: dict[tuple[str, str], float] = {}
            for p in ports:
                if p.get("speed_mbps"):
                    k = (p.get("model") or "", p.get("link_layer") or "")
                    fastest[k] = max(fastest.get(k, 0.0), p["speed_mbps"])
            worst, rdma_min, missing = 1.0, None, 0
            for p in ports:
                e = f"{node}/{p['nic']}"
                self.nics[node].add(e)
                speed = p.get("speed_mbps")
                if speed:
                    put("nic.speed_gbps", e, t, speed / 1000.0)
                    top = fastest[(p.get("model") or "", p.get("link_layer") or "")]
                    put("nic.speed_ratio", e, t, speed / top)
                    worst = min(worst, speed / top)
                    if p.get("speed_common_max_mbps"):
                        put("nic.speed_common_ratio", e, t, speed / p["speed_common_max_mbps"])
                    if p.get("rdma") and p["link_up"]:
                        rdma_min = speed / 1000.0 if rdma_min is None else min(rdma_min, speed / 1000.0)
                if p.get("rdma") and p.get("gids") is not None:
                    gone = p["link_up"] and (p["gids"] == 0 or (p.get("link_layer") == "Ethernet"
                                                                and not p.get("roce_v2_gids")))
                    put("nic.gid_missing", e, t, 1.0 if gone else 0.0)
                    missing += gone
            put("net.port_speed_ratio", node, t, worst)
            put("net.gids_missing", node, t, float(missing))
            if rdma_min is not None:
                put("net.rdma_min_gbps", node, t, rdma_min)
        kernel = msg.get("kernel")
        if kernel is not None:
            counts = dict.fromkeys(kernel_classes, 0.0)
            for ev in kernel:
                if ev["class"] in counts:
                    counts[ev["class"]] += 1.0
            for metric, n in zip(_KERNEL_METRICS, counts.values(), strict=True):
                put(metric, node, t, n)
            put("kernel.hw_errors", node, t, sum(counts[c] for c in kernel_hw))
        bmc = msg.get("bmc")
        if bmc is not None:
            bad = {"fan": 0.0, "psu": 0.0, "redundancy": 0.0}
            hot = 0.0
            inlet: list[float] = []
            exhaust: list[float] = []
            power = 0.0
            for sns in bmc:
                kind, ok = sns["type"], sns["health"] in ("ok", "unknown")
                if kind in bad and not ok:
                    bad[kind] += 1.0
                if kind == "temperature":
                    hot += 0.0 if ok else 1.0
                    if sns.get("reading") is not None:
                        if sns.get("context") == "inlet":
                            inlet.append(sns["reading"])
                        elif sns.get("context") == "exhaust":
                            exhaust.append(sns["reading"])
                if kind == "power" and sns.get("reading") is not None:
                    power += sns["reading"]
            put("bmc.fans_failed", node, t, bad["fan"])
            put("bmc.psus_failed", node, t, bad["psu"])
            put("bmc.redundancy_lost", node, t, bad["redundancy"])
            put("bmc.temps_over_threshold", node, t, hot)
            if inlet:
                put("bmc.inlet_temp_c", node, t, max(inlet))
            if exhaust:
                put("bmc.exhaust_temp_c", node, t, max(exhaust))
            if power:
                put("bmc.power_w", node, t, power)
        nvml = msg.get("nvml")
        if nvml:
            gpu, responsive, latency, errors, timeouts = events.columns(
                nvml, ("gpu", "responsive", "latency_ms", "errors", "timeouts"))
            ents, rows = self._entities("gpu", msg, node, gpu)
            self.put_many("gpu.nvml_unresponsive", "gpu", ents, rows, t, [0.0 if r else 1.0 for r in responsive])
            self.put_many("gpu.nvml_latency_ms", "gpu", ents, rows, t, latency)
            self.put_many("gpu.nvml_errors", "gpu", ents, rows, t, errors)
            self.put_many("gpu.nvml_timeouts", "gpu", ents, rows, t, timeouts)

    def _derive_steps(self, msg: Mapping[str, Any], t: float, node: str) -> None:
        """The step tables, ``comm_s`` where only its parts came, and the job buckets."""
        job = msg["job"]
        steps = msg["steps"]
        if not steps:
            return
        sec = int(t)
        table = self.step_tables.get(job)
        if table is None:
            table = self.step_tables[job] = StepTable()
        ranks, nums, durs, ended, *phases = events.columns(steps, ("rank", "step", "duration_s", "ended_at") + PHASES)
        data, compute, comm, collective, pipeline, _ = phases
        if None in comm:  # the declared field absent: its parts' sum, where a part came
            comm = tuple(c if c is not None or (k is None and w is None) else (k or 0.0) + (w or 0.0)
                         for c, k, w in zip(comm, collective, pipeline, strict=True))
            ents, rows = self._entities("rank", msg, node, ranks)
            derived = [c if c is not None and sent is None else None for c, sent in zip(comm, phases[2], strict=True)]
            self.put_many("step.comm_s", "rank", ents, rows, t, derived)
            phases[2] = comm
        add = table.add
        if None in ended:
            table.unstamped.update(int(r) for r, e in zip(ranks, ended, strict=True) if e is None)
        elif table.unstamped:
            table.unstamped.difference_update(int(r) for r in ranks)
        for r, n, dur, end, d, c, m, k, w, ck in zip(ranks, nums, durs, ended, *phases, strict=True):
            # A step's own end time when the producer gives it (several steps per message), else the
            # message's time; never later than the message, so a bad clock cannot run ahead of it.
            t_end = min(float(end), t) if end is not None else t
            add(int(n), int(r), StepRec(
                t_end, float(dur), None if d is None else float(d), None if c is None else float(c),
                None if m is None else float(m), None if k is None else float(k), None if w is None else float(w),
                None if ck is None else float(ck)))
        # The job's per-second buckets (medians over ranks when the second closes); an absent phase is
        # unknown, not zero: no point at all.
        buckets = self._buckets
        for f, vs, kept in zip(_JOB_FIELDS, (durs, *phases), self._job_fields, strict=True):
            got = [v for v in vs if v is not None] if kept else None
            if got:
                buckets[(job, f)].setdefault(sec, []).extend(got)
        for part, share, kept in zip((data, comm, compute), ("data_wait_share", "comm_share", "compute_share"),
                                     self._shares, strict=True):
            if not kept:
                continue
            got = [v / d for v, d in zip(part, durs, strict=True) if v is not None and d > 0]
            if got:
                buckets[(job, share)].setdefault(sec, []).extend(got)

    def _derive_checkpoint(self, msg: Mapping[str, Any], t: float, node: str) -> None:
        job, cid, phase = msg["job"], msg["checkpoint_id"], msg["phase"]
        spans = self.checkpoint_spans[job]
        if phase == "start":
            self.open_checkpoints[(job, cid)] = t
            spans[cid] = [t, None]
            while len(spans) > 8:  # the recent saves are enough to judge what is open now
                del spans[next(iter(spans))]
            return
        start = self.open_checkpoints.pop((job, cid), None)
        if cid in spans:
            spans[cid][1] = t
        if phase == "end":
            dur = msg.get("duration_s")
            if dur is None and start is not None:
                dur = t - start
            if dur is not None:
                self.put("checkpoint.duration_s", job, t, float(dur))
        elif phase == "failed":
            self.put("checkpoint.failed", job, t, 1.0)

    # ---- time -------------------------------------------------------------------------------------

    def close_buckets(self, watermark: float) -> None:
        """Reduce every per-second job bucket that ends at or before ``watermark`` to its median.

        Called by the evaluator before each tick, so ``watermark`` is also the evaluation clock.
        """
        self.clock = watermark
        for (job, f), buckets in self._buckets.items():
            done = [sec for sec in buckets if sec + 1 <= watermark]
            for sec in sorted(done):
                vals = buckets.pop(sec)
                name = f"job.{f}"
                self.put(name, job, sec + 1.0, statistics.median(vals))

    def trim(self, now: float) -> None:
        """Forget points older than the retention; called by the evaluator now and then."""
        self.flush()
        self._memo.clear()
        cutoff = now - self.retention_s
        job_cutoff = now - self.job_retention_s
        for key, s in list(self._series.items()):
            s.trim(job_cutoff if key[0] in _JOB_LEVEL or key[0].startswith("job.") else cutoff)
            if not s.t:  # an entity gone for the whole retention (a finished job's ranks): forget it
                del self._series[key]
                del self._by_metric[key[0]][key[1]]
        # The rings are fixed; an entity silent for the whole retention in every metric of its level is freed.
        for rows in self.levels.values():
            cols = [c for c in self.columns.values() if c.shared is rows]
            if not cols or not rows.index:
                continue
            for c in cols:
                c._fit()
            newest = np.max([c.newest[:len(rows.entity_of)] for c in cols], axis=0)
            # a row with points still waiting for the clock is not silent (and its number must not be reused)
            waiting = {int(r) for c in cols if c.held is not None for r in np.unique(c.held[0])}
            waiting.update(r for c in cols for r in c.s_row)
            gone = [r for r in np.nonzero(newest < cutoff)[0].tolist()
                    if rows.entity_of[r] is not None and r not in waiting]
            if gone:
                for r in gone:
                    rows.drop(rows.entity_of[r])  # type: ignore[arg-type]
                self._ents.clear()  # a freed row may be handed to another entity
                freed = np.array(gone, np.int64)
                for c in cols:
                    c.clear(freed)
        for seen in self.node_seen.values():
            seen.trim(cutoff)
        for job, table in list(self.step_tables.items()):
            if table.newest_t < cutoff:  # a finished job: forget its steps
                del self.step_tables[job]

    # ---- reading ----------------------------------------------------------------------------------

    def window(self, metric: str, entity: str, t0: float, t1: float) -> tuple[Sequence[float], Sequence[float]]:
        """The points of ``metric`` for ``entity`` with ``t0 < t <= t1``.

        Ages (``checkpoint.open_s``, ``step.since_last_s``, ``node.since_last_s``) are not stored:
        they are one point computed at ``t1``.
        """
        if metric in _AGES:
            v = self.age(metric, entity, t1)
            return ((t1,), (v,)) if v is not None else ((), ())
        self._read(metric)
        col = self.columns.get(metric)
        if col is not None:
            self._reach(col, metric, t1 - t0)
            col.flush(self._upto())
            r = col.rows.get(entity)
            if r is None:
                return (), ()
            times, values = col.points(r, t0, t1)
            return (times, values) if times else ((), ())
        s = self._series.get((metric, entity))
        return s.window(t0, t1) if s is not None else ((), ())

    def ever(self, metric: str, entity: str, now: float) -> bool:
        """Whether ``entity`` has any point of ``metric`` kept at or before ``now`` (however old).

        Called by the evaluator to tell a check over a phase a job never reported from one that held no
        finding.  A metric the store does not keep counts as never seen.
        """
        col = self.columns.get(metric)
        if col is not None:
            col.flush(self._upto())
            r = col.rows.get(entity)
            return r is not None and col.last(r, now) is not None
        s = self._series.get((metric, entity))
        return s is not None and bool(s.t) and s.t[0] <= now

    def age(self, metric: str, entity: str, now: float) -> float | None:
        """Seconds at ``now`` since the entity last reported, or since its oldest open checkpoint began."""
        if metric == "checkpoint.open_s":
            spans = self.checkpoint_spans.get(entity)
            starts = [s for s, e in (spans or {}).values() if s is not None and s <= now and (e is None or e > now)]
            return now - min(starts) if starts else None
        # The last report at or before ``now``: messages up to the lateness ahead are already stored.
        if metric == "step.since_last_s":
            col = self.columns.get("step.duration_s")
            r = col.rows.get(entity) if col is not None else None
            if r is None:
                return None
            col.flush(self._upto())  # type: ignore[union-attr]
            last = col.last(r, now)  # type: ignore[union-attr]
            return None if last is None else now - last
        seen = self.node_seen.get(entity)
        if seen is None or not seen.t:
            return None
        i = bisect.bisect_right(seen.t, now)
        if i == 0:
            return None
        return now - seen.t[i - 1]

    def reporting(self, t0: float, now: float) -> tuple[int, int]:
        """How many nodes reported in ``(t0, now]``, and how many have reported at all (any kept report);
        cached for one ``(t0, now)`` (a tick asks it once per job).

        Called by the node absence condition to tell "the data has ended" (a replay's or a rule test's
        last ticks, which run on past their data; or only a node whose clock runs ahead still stamping
        later times) from "these nodes went dark while the rest of the cluster reports".
        """
        memo = self._reported_memo
        if memo is not None and memo[0] == (t0, now):
            return memo[1]
        known = hit = 0
        for seen in self.node_seen.values():
            t = seen.t
            if not t:
                continue
            known += 1
            if t[-1] > t0:
                i = bisect.bisect_right(t, now)
                if i and t[i - 1] > t0:
                    hit += 1
        self._reported_memo = ((t0, now), (hit, known))
        return hit, known

    def telemetry_since(self) -> float | None:
        """Event time of the first node report this store received (None: none yet).

        Called by the node absence condition: a node its job runs on that has never reported, while
        telemetry has come in for ``for``, has no agent (or one publishing under another name).
        Judged against the whole cluster's reports, not the job's, so a job all of whose nodes are
        unseen (a single-node job, a node pool without agents) is told too.
        """
        return self.first_report_t

    def ages(self, metric: str, entities: Sequence[str], now: float) -> np.ndarray:
        """:meth:`age` for each of ``entities`` (NaN: never reported), vectorised for ranks' step reports."""
        col = self.columns.get("step.duration_s") if metric == "step.since_last_s" else None
        if col is None or not entities:
            return np.array([np.nan if a is None else a for a in (self.age(metric, e, now) for e in entities)],
                            np.float64)
        col.flush(self._upto())
        rows = self.rows_of(col.shared, tuple(entities))  # the same ranks every tick: cached
        out = np.full(len(entities), np.nan)
        known = np.nonzero(rows >= 0)[0]
        if not len(known):
            return out
        col._fit()
        newest = col.newest[rows[known]]
        # A row whose newest point is not after ``now``: that point is its last report.  Rows with points
        # ahead of ``now`` (stored up to the lateness early) look back over a few slots, then row by row.
        now_s = math.floor(now)
        done = (newest <= now_s) & (newest != _EMPTY)
        out[known[done]] = now - newest[done]
        ahead = known[newest > now_s]
        if len(ahead):
            m = col.matrix(rows[ahead], now - 16, now)
            if m is not None and m[2].shape[1]:
                times, _, cnt = m
                has = cnt.any(axis=1)
                last = times[cnt.shape[1] - 1 - np.argmax(cnt[:, ::-1] > 0, axis=1)]
                out[ahead[has]] = now - last[has]
                ahead = ahead[~has]
            for i in ahead:
                a = self.age(metric, entities[i], now)
                out[i] = np.nan if a is None else a
        return out

    def span(self, metric: str, entity: str, now: float, window_s: float, min_points: int = 0) -> float:
        """The window length to use at ``now``: ``window_s``, or longer to hold the last ``min_points`` points.

        Lets a rule count its window in steps as well as seconds ("whichever is longer"): a job
        with 45 s steps has no step in most 5 s windows.
        """
        if min_points <= 0 or metric in _AGES:
            return window_s
        self._read(metric)
        col = self.columns.get(metric)
        if col is not None:
            self._reach(col, metric, window_s)
            r = col.rows.get(entity)
            if r is None:
                return window_s
            col.flush(self._upto())
            idx, cnt = col.counts(r, now)
            total = np.cumsum(cnt)
            if not len(total) or total[-1] == 0:
                return window_s
            k = int(np.searchsorted(total, min_points))  # the slot holding the min_points-th newest point
            k = min(k, len(total) - 1)
            if total[k] < min_points:  # fewer points than asked: back to the oldest
                k = int(np.nonzero(cnt)[0][-1])
            return max(window_s, now - float(idx[k]) + 1e-6)  # the window's start just before that slot
        s = self._series.get((metric, entity))
        if s is None or not s.t:
            return window_s
        j = bisect.bisect_right(s.t, now)
        if j < min_points:
            return window_s if j == 0 else max(window_s, now - s.t[0] + 1e-6)
        return max(window_s, now - s.t[j - min_points] + 1e-6)

    def value(self, metric: str, entity: str, agg: str, now: float, window_s: float) -> float | None:
        """The ``agg`` of ``metric`` for ``entity`` over ``(now - window_s, now]``, or None if no data."""
        if metric in self.columns:  # the columns' path, which counts every point of a slot
            v = self.values(metric, (entity,), agg, now, window_s)[0]
            return None if math.isnan(v) else float(v)
        times, values = self.window(metric, entity, now - window_s, now)
        return aggregate(agg, times, values)

    def values(self, metric: str, entities: Sequence[str], agg: str, now: float, window_s: float) -> np.ndarray:
        """The ``agg`` of ``metric`` over ``(now - window_s, now]`` for each of ``entities`` (NaN: no data).

        The vectorised :meth:`value`: for a columnar metric, one numpy pass over every entity's slots
        (called by the conditions once per rule and job, instead of once per entity).
        """
        self._read(metric)
        col = self.columns.get(metric)
        if col is not None:
            self._reach(col, metric, window_s)
            col.flush(self._upto())
        # Several rules read the same aggregate of the same entities in one tick: computed once, kept
        # until new points are applied to the column (its version) or the entities change.
        ents = tuple(entities)
        key = (metric, agg, now, window_s, ents, col.version if col is not None else 0)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        out = None
        if col is not None and ents:
            rows = self.rows_of(col.shared, ents)
            known = rows >= 0
            if known.any():
                m = col.matrix(rows[known], now - window_s, now)
                if m is not None:
                    out = np.full(len(ents), np.nan)
                    out[known] = aggregate_rows(agg, *m)
        if out is None and col is None and metric in COLUMNAR:
            out = np.full(len(ents), np.nan)  # a columnar metric without a column never had a point
        if out is None:
            vals = [aggregate(agg, *self.window(metric, e, now - window_s, now)) for e in ents]
            out = np.array([np.nan if v is None else v for v in vals], np.float64)
        out.flags.writeable = False  # shared by every reader of this tick
        # Only this tick's answers are kept: a key holds its tuple of entity names (10,240 strings for a
        # big job's GPUs, made afresh each tick), and keeping up to 4,096 keys across ticks held ~200 MiB
        # more after 150 s at 1,280 nodes, growing.
        if now != self._memo_now or len(self._memo) > 4096:
            self._memo.clear()
            self._memo_now = now
        self._memo[key] = out
        return out

    def zero_in(self, metric: str, now: float, window_s: float) -> bool:
        """Whether no entity has a point of ``metric`` other than 0 in ``(now - window_s, now]``.

        Called by the conditions before reading a window of every entity: then every aggregate but a
        count is 0 or missing, whatever the entities (an XID counter, an unresponsive flag at 10,240 GPUs).
        False when it cannot tell (a metric kept as series, not columns).
        """
        self._read(metric)
        col = self.columns.get(metric)
        if col is None:
            return metric in COLUMNAR  # a columnar metric without its column never had a point
        col.flush(self._upto())
        return col.nonzero_until <= math.floor(now - window_s)

    def rows_of(self, rows: Rows, ents: tuple[str, ...]) -> np.ndarray:
        """The rows of ``ents`` at a level (-1: not stored), cached until the level's entities change.

        Every rule reads the same entity lists of a job (its GPUs, its ranks) on every tick.
        """
        key = (id(rows), ents)
        hit = self._rows_memo.get(key)
        if hit is not None and hit[0] == rows.version:
            return hit[1]
        index = rows.index
        out = np.fromiter((index.get(e, -1) for e in ents), np.int64, len(ents))
        out.flags.writeable = False
        if len(self._rows_memo) >= 1024:
            self._rows_memo.clear()
        self._rows_memo[key] = (rows.version, out)
        return out

    def occurring(self, metric: str) -> set[str]:
        """The entities holding a series of ``metric`` kept exactly (occurrences such as XIDs)."""
        return set(self._by_metric.get(metric, ()))

    def nic_entities(self, nodes: Iterable[str]) -> list[str]:
        return self.entities_at("nic", nodes)

    def entities_at(self, level: str, nodes: Iterable[str]) -> list[str]:
        """The entities at ``level`` (``nic``, ``device``) seen on ``nodes``, sorted."""
        seen = self.members.get(level, {})
        return sorted(e for n in nodes for e in seen.get(n, ()))


class SeriesView(Mapping[tuple[str, str], Series]):
    """Every series of a store as ``(metric, entity) -> Series``: the exact ones, and the columns' rows
    materialised over the retention on access (for inspection, tests and whywait's own metrics)."""

    def __init__(self, store: MetricStore) -> None:
        self.store = store

    def __iter__(self) -> Iterator[tuple[str, str]]:
        yield from self.store._series
        for metric, col in self.store.columns.items():
            for e, r in col.rows.items():
                if r < len(col.newest) and col.newest[r] != _EMPTY:
                    yield (metric, e)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getitem__(self, key: tuple[str, str]) -> Series:
        s = self.store._series.get(key)
        if s is not None:
            return s
        col = self.store.columns.get(key[0])
        r = col.rows.get(key[1]) if col is not None else None
        if col is None or r is None or r >= len(col.newest) or col.newest[r] == _EMPTY:
            raise KeyError(key)
        out = Series()
        newest = float(col.newest[r])
        out.t, out.v = col.points(r, newest - col.buckets * col.bucket_s, newest)
        return out


# The derivation of each kind, called after its declared fields are stored.  An explicit table: a
# kind without derived metrics has no entry.
DERIVATIONS: dict[str, Callable[[MetricStore, Mapping[str, Any], float, str], None]] = {
    "gpu": MetricStore._derive_gpu,
    "net": MetricStore._derive_net,
    "host": MetricStore._derive_host,
    "hw": MetricStore._derive_hw,
    "steps": MetricStore._derive_steps,
    "checkpoint": MetricStore._derive_checkpoint,
}
