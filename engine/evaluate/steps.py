"""Step-aligned views of a job's timings: ranks compared on the same step numbers.

Wall-clock windows fail on real jobs.  A 45 s step lands in a 5 s window on one
tick in nine, and a 300 s baseline holds a handful of points.  Ranks of a
synchronous job also finish a step at slightly different times, so buckets by
second pair step 812 of one rank with step 811 of another.  This module keeps,
per job, the last few hundred steps as a table ``step -> rank -> StepRec``.  The
step-aligned conditions (:mod:`whywait.engine.evaluate.conditions`) read it.

Why compare the *split* and not the step time: in a synchronous job every rank
leaves the collective together, so every rank's step time is the same.  The
straggler shows only in how that time divides.  It has the most local work
(compute plus input wait) and the least communication, because everyone else
waits for it there.  :func:`work` is that local work.  Where a producer sends
the step time alone (contract v2: the split is optional), the step time stands
in.  That still finds stragglers in asynchronous jobs, whose step times differ.

Statistics are robust by construction, not by tuning:

- The reference at each step is the *lower quartile* of the comparable ranks.
  Up to half the ranks may be slow without moving it, where the median flips.
- The spread is measured on the *fast group* (ranks at or below the median).
- A rank's own history (the steps before the window) tells steady heterogeneity
  (a slower GPU model since the start) from a new fault.

Pure: no Kafka, no faust.  Fed by :class:`whywait.engine.evaluate.store.MetricStore`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

PHASES = ("data_wait_s", "compute_s", "comm_s", "collective_s", "pipeline_wait_s", "checkpoint_s")
# How a phase is named in diagnoses (the words: compute, input, communication).
PHASE_NAMES = {"compute_s": "compute", "data_wait_s": "input", "comm_s": "communication",
               "collective_s": "communication", "pipeline_wait_s": "communication", "duration_s": "step"}


_STEP_FIELDS = ("t", "duration_s", *PHASES)


class StepRec:
    """One rank's timings for one step; a phase the producer did not send is None (unknown, not zero).

    Read-only by convention.  Why not a frozen dataclass, as it was: the store makes one per rank per
    step (10,240 a second at 1,280 nodes), and a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``: 2.0 µs a record against 0.4 here.  Equality and hashing are over the fields,
    as the dataclass's were (``work_s`` is derived, so it takes no part).
    """

    __slots__ = (*_STEP_FIELDS, "work_s")

    t: float  # when the step ended (event time)
    duration_s: float
    data_wait_s: float | None
    compute_s: float | None
    comm_s: float | None
    collective_s: float | None
    pipeline_wait_s: float | None
    checkpoint_s: float | None
    # :func:`work`, computed once: the step conditions read it for every rank of every step on each tick
    work_s: float

    def __init__(self, t: float, duration_s: float, data_wait_s: float | None = None, compute_s: float | None = None,
                 comm_s: float | None = None, collective_s: float | None = None,
                 pipeline_wait_s: float | None = None, checkpoint_s: float | None = None) -> None:
        self.t = t
        self.duration_s = duration_s
        self.data_wait_s = data_wait_s
        self.compute_s = compute_s
        self.comm_s = comm_s
        self.collective_s = collective_s
        self.pipeline_wait_s = pipeline_wait_s
        self.checkpoint_s = checkpoint_s
        self.work_s = work(self)

    def _fields(self) -> tuple[Any, ...]:
        return (self.t, self.duration_s, self.data_wait_s, self.compute_s, self.comm_s, self.collective_s,
                self.pipeline_wait_s, self.checkpoint_s)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepRec):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "StepRec(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in _STEP_FIELDS) + ")"

    def get(self, phase: str) -> float | None:
        """The value of ``phase`` (``work``, ``duration_s`` or a field name), None when unknown."""
        if phase == "work":
            return self.work_s
        v = getattr(self, phase)
        return None if v is None else float(v)


def work(r: StepRec) -> float:
    """A rank's own time in a step, waits for others excluded.

    Compute plus input wait when the producer split the step; else the step time less its
    communication; else the step time itself.
    """
    if r.compute_s is not None:
        return r.compute_s + (r.data_wait_s or 0.0)
    if r.comm_s is not None:
        return max(0.0, r.duration_s - r.comm_s - (r.checkpoint_s or 0.0))
    return r.duration_s


class StepRow(dict[int, StepRec]):
    """One step of a job: ``rank -> StepRec``, with what :func:`judge_ranks` computed of it.

    A plain dict to its readers.  ``stats`` holds, per (measure, group), the step's ratios and robust
    z of each rank (:func:`_step_stats`): a step stays in the window and then the history for dozens
    of ticks, and is judged the same way on each.  A record added to the step empties it.
    """

    __slots__ = ("stats", "table", "t_max", "t_min")

    def __init__(self, table: StepTable | None = None) -> None:
        super().__init__()
        self.stats: dict[tuple[Any, ...], Any] | None = None
        self.table = table
        self.t_max = -math.inf  # when its last rank ended (kept by StepTable.add)
        self.t_min = math.inf  # when its first rank ended (kept by StepTable.add)


# Steps whose per-step statistics are kept, per job: the window and history one tick reads (60 + the
# window's steps), with room for a longer window.  Older steps' statistics are dropped.
_STATS_ROWS = 128
# Steps of a job kept as records (StepRow): the newest, which its ranks are still reporting.  Older ones
# are frozen into arrays (FrozenRow), which the step conditions read a column at a time (faster than
# the records: a searchsorted instead of 10,240 dict lookups); a rank reporting one late is put in place.
_HOT_ROWS = 16
# The ranks a frozen step's int32 column can hold.  The contract refuses any other (``RANK_MAX`` in
# ``agents/events.py``); a record that reached the table without it (a dict from a test or the
# simulator) is dropped, because freezing its step would fail and take the job's other ranks with it.
_RANK_DTYPE = np.int32
_RANK_LO, _RANK_HI = int(np.iinfo(_RANK_DTYPE).min), int(np.iinfo(_RANK_DTYPE).max)
# The record fields a frozen step keeps as columns (``t`` and ``duration_s`` always; a phase only when
# some rank of the step sent it).
_REC_FIELDS = _STEP_FIELDS


class FrozenRow(Mapping[int, StepRec]):
    """One step older than a job's newest ``_HOT_ROWS``: ``rank -> StepRec`` read from arrays.

    Why: a 10,240-rank job's 600 kept steps as records were 6M StepRec objects of ~290 bytes (with
    their floats and dict entries), 1.7 GiB, most of the engine's memory at 1,280 nodes.  As columns
    they are 8 bytes per field a rank sent plus 4 for the rank (44 bytes for the usual split): only
    the newest steps, which every tick reads record by record, stay records.  The values are the
    very floats the records held (float64, NaN standing for a phase not sent: the contract admits
    finite numbers only), so a step judged after it froze is judged exactly as before.  Iterating
    it gives the ranks in ascending order; the readers that matter at scale take a column at once
    (:meth:`column`, :func:`row_end`, :func:`row_median`) instead of building records.
    """

    __slots__ = ("ranks", "cols", "stats", "table", "t_max", "t_end")

    def __init__(self, row: Mapping[int, StepRec], table: StepTable | None = None) -> None:
        items = sorted(row.items())
        self.ranks = np.fromiter((r for r, _ in items), _RANK_DTYPE, len(items))
        self.cols: dict[str, np.ndarray] = {}
        for f in _REC_FIELDS:
            vals = [getattr(rec, f) for _, rec in items]
            if f in ("t", "duration_s") or any(v is not None for v in vals):
                self.cols[f] = np.array([math.nan if v is None else v for v in vals], np.float64)
        self.stats: dict[tuple[Any, ...], Any] | None = getattr(row, "stats", None)
        self.table = table
        self.t_max = float(self.cols["t"].max()) if len(items) else -math.inf
        self.t_end = _end_of(self.cols["t"], self.cols["duration_s"]) if len(items) else -math.inf

    def _at(self, rank: int) -> int:
        i = int(np.searchsorted(self.ranks, rank))
        return i if i < len(self.ranks) and int(self.ranks[i]) == rank else -1

    def _rec(self, i: int) -> StepRec:
        vals = {f: (None if math.isnan(x := float(c[i])) else x) for f, c in self.cols.items()}
        return StepRec(**vals)  # type: ignore[arg-type]  # t and duration_s are always columns

    def __getitem__(self, rank: int) -> StepRec:
        i = self._at(rank) if isinstance(rank, (int, np.integer)) else -1
        if i < 0:
            raise KeyError(rank)
        return self._rec(i)

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, (int, np.integer)) and self._at(int(rank)) >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.ranks.tolist())

    def __len__(self) -> int:
        return len(self.ranks)

    def put(self, rank: int, rec: StepRec) -> None:
        """Add (or replace) one rank's record: a rank that reports a step long after the others."""
        i = int(np.searchsorted(self.ranks, rank))
        new = i >= len(self.ranks) or int(self.ranks[i]) != rank
        for f in _REC_FIELDS:
            v = getattr(rec, f)
            col = self.cols.get(f)
            if col is None:
                if v is None:
                    continue
                col = np.full(len(self.ranks), math.nan)
            x = math.nan if v is None else float(v)
            if new:
                col = np.insert(col, i, x)
            else:
                col[i] = x
            self.cols[f] = col
        if new:
            self.ranks = np.insert(self.ranks, i, rank)
        self.t_max = float(self.cols["t"].max())
        self.t_end = _end_of(self.cols["t"], self.cols["duration_s"])

    def records(self) -> dict[int, StepRec]:
        """Every rank's record (built: for readers that need whole records)."""
        return {int(r): self._rec(i) for i, r in enumerate(self.ranks)}

    def column(self, measure: str) -> np.ndarray:
        """``measure`` (``work``, ``duration_s`` or a phase) for every rank in :attr:`ranks` order, NaN where unknown.

        ``work`` follows :func:`work` element by element (the same operations on the same floats).
        """
        if measure != "work":
            got = self.cols.get(measure)
            return got if got is not None else np.full(len(self.ranks), math.nan)
        dur = self.cols["duration_s"]
        out = dur.copy()
        comm = self.cols.get("comm_s")
        if comm is not None:
            ck = self.cols.get("checkpoint_s")
            rest = dur - comm - (np.nan_to_num(ck, nan=0.0) if ck is not None else 0.0)
            has = ~np.isnan(comm)
            out[has] = np.maximum(0.0, rest[has])
        comp = self.cols.get("compute_s")
        if comp is not None:
            dw = self.cols.get("data_wait_s")
            tot = comp + (np.nan_to_num(dw, nan=0.0) if dw is not None else 0.0)
            has = ~np.isnan(comp)
            out[has] = tot[has]
        return out

    def of(self, members: Sequence[int], measure: str) -> np.ndarray:
        """``measure`` for each of ``members`` (NaN for a rank the step lacks, or without it)."""
        m = np.asarray(members, np.int64)
        col = self.column(measure)
        if not len(self.ranks):
            return np.full(len(m), math.nan)
        idx = np.minimum(np.searchsorted(self.ranks, m), len(self.ranks) - 1)
        found = self.ranks[idx] == m
        return np.where(found, col[idx], math.nan)


StepRows = (StepRow, FrozenRow)  # the rows a StepTable holds (isinstance checks)


# A rank's end of a step this far past the step's median end is not the step ending late: it is a node
# whose clock runs ahead (the bound ``job.node-clock-skew`` names a clock past: 2 s, and 2 median step
# times, more than pipeline stages explain).
_END_AHEAD_S = 2.0
_END_AHEAD_STEPS = 2.0


def row_end(row: Mapping[int, StepRec]) -> float:
    """When the step ended: its last rank's end, unless that rank's clock is ahead of the others'.

    Called wherever a step is placed in event time (is it complete by ``now``, which window holds it).
    Why not simply the last end: one node whose clock ran 120 s ahead held every step of its job
    incomplete for 120 s, so no step rule judged that job (a straggler, the clock itself) for two
    minutes.  Ends further past the median end than :func:`_end_of` allows are left out.  The ranks of
    a step end within ``_END_AHEAD_S`` of each other as a rule, and then nothing is computed.
    """
    t = getattr(row, "t_end", None)  # a frozen step: computed when it froze
    if t is not None:
        return float(t)
    t = getattr(row, "t_max", None)
    if t is None:  # a plain dict of records (tests, imports)
        recs = list(row.values())
        return _end_of([r.t for r in recs], [r.duration_s for r in recs])
    if t - row.t_min <= _END_AHEAD_S:  # type: ignore[attr-defined]  # a StepRow
        return float(t)
    return float(kept_stat(row, ("end",), lambda: _end_of([r.t for r in row.values()],
                                                            [r.duration_s for r in row.values()])))


def _end_of(ends: Sequence[float] | np.ndarray, durations: Sequence[float] | np.ndarray) -> float:
    """The latest of ``ends`` that is at most the ahead bound past their median (see :func:`row_end`)."""
    ts = np.asarray(ends, np.float64)
    if len(ts) == 0:
        return -math.inf
    top = float(ts.max())
    if top - float(ts.min()) <= _END_AHEAD_S:
        return top
    cap = float(np.median(ts)) + max(_END_AHEAD_S, _END_AHEAD_STEPS * float(np.median(np.asarray(durations))))
    return float(ts[ts <= cap].max())


def known(row: Mapping[int, StepRec], ranks: Iterable[int] | None, measure: str, skip: int | None = None
          ) -> list[float]:
    """The values of ``measure`` the step holds for ``ranks`` (every rank of the step when None, less
    ``skip``), in their order; a rank without it is left out.

    Called by the step conditions that read one phase of many ranks of a step; a frozen step answers
    from its column.
    """
    if isinstance(row, FrozenRow):
        col = row.column(measure) if ranks is None else row.of(list(ranks), measure)
        keep = ~np.isnan(col)
        if skip is not None and ranks is None:
            keep &= row.ranks != skip
        return col[keep].tolist()  # type: ignore[no-any-return]
    # What StepRec.get gives, read from the record's field without the call (1,024 records a step).
    if measure == "work":
        if ranks is None:
            return [rec.work_s for r, rec in row.items() if r != skip]
        return [rec.work_s for r in ranks if r != skip and (rec := row.get(r)) is not None]
    if ranks is None:
        return [float(v) for r, rec in row.items() if r != skip and (v := getattr(rec, measure)) is not None]
    return [float(v) for r in ranks
            if r != skip and (rec := row.get(r)) is not None and (v := getattr(rec, measure)) is not None]


def column_of(row: Mapping[int, StepRec], ranks: Sequence[int], measure: str) -> np.ndarray:
    """``measure`` for each of ``ranks`` in their order, NaN where the step lacks the rank or its value."""
    if isinstance(row, FrozenRow):
        return row.of(ranks, measure)
    attr = _ATTR.get(measure, measure)
    get = row.get
    return np.array([v if (rec := get(r)) is not None and (v := getattr(rec, attr)) is not None else math.nan
                     for r in ranks], np.float64)


# StepRec.get's ``work`` is its kept field ``work_s``; every other measure is the field of its name.
_ATTR = {"work": "work_s"}


def row_median(row: Mapping[int, StepRec], field_name: str = "duration_s") -> float:
    """The median over the step's ranks of one record field (every rank has ``t`` and ``duration_s``).

    Kept on the step (:func:`kept_stat`): the cost figure asks it of the same recent steps on every tick.
    """
    return float(kept_stat(row, ("median", field_name), lambda: _row_median(row, field_name)))


def _row_median(row: Mapping[int, StepRec], field_name: str) -> float:
    if isinstance(row, FrozenRow):
        return float(statistics.median(row.cols[field_name].tolist()))
    return float(statistics.median(getattr(r, field_name) for r in row.values()))


class StepTable:
    """The last ``keep`` steps of one job: ``step -> {rank: StepRec}``, oldest first.

    The newest ``_HOT_ROWS`` steps are :class:`StepRow` (records); older ones :class:`FrozenRow` (arrays).
    """

    __slots__ = ("keep", "steps", "ranks", "newest_t", "_memo", "_with_stats", "unstamped", "newest_step")

    def __init__(self, keep: int = 600) -> None:
        self.keep = keep
        self.steps: OrderedDict[int, Mapping[int, StepRec]] = OrderedDict()
        self._with_stats: deque[Any] = deque()  # rows holding statistics, oldest first (bounded)
        self.ranks: set[int] = set()  # every rank that has reported (the coverage a complete step needs)
        # Ranks whose latest records came without their own ``ended_at``: their step ends are the
        # batch's send time, not when the step ended, so they say nothing of the node's clock.
        self.unstamped: set[int] = set()
        self.newest_step: dict[int, int] = {}  # rank -> the newest step it reported (whatever its stamp)
        self.newest_t = -math.inf
        # complete() is asked several times per tick (one per step-aligned leaf): the answer for one
        # (now, coverage) holds until a record arrives.
        self._memo: tuple[float, float, list[tuple[int, Mapping[int, StepRec]]]] | None = None

    def add(self, step: int, rank: int, rec: StepRec) -> None:
        """Called by the store for each step record; keeps the table bounded by ``keep`` steps."""
        if not _RANK_LO <= rank <= _RANK_HI:
            return  # cannot be frozen with the step's other ranks (see _RANK_DTYPE)
        if step > self.newest_step.get(rank, -1):
            self.newest_step[rank] = step
        row = self.steps.get(step)
        if row is None:
            if self.steps and step < next(iter(self.steps)) and len(self.steps) >= self.keep:
                return  # older than anything kept, and the table is full: it cannot matter
            row = self.steps[step] = StepRow(self)
            if self.steps and step < next(reversed(self.steps)):
                self.steps = OrderedDict(sorted(self.steps.items()))  # rare: a late step arrived
            while len(self.steps) > self.keep:
                self.steps.popitem(last=False)
            self._freeze()
        elif isinstance(row, FrozenRow):  # a rank reported a step long after the others
            row.put(rank, rec)
            if row.stats is not None:  # its statistics change
                row.stats = None
                self._with_stats = deque(r for r in self._with_stats if r is not row)
            self._memo = None
            self.ranks.add(rank)
            self.newest_t = max(self.newest_t, rec.t)
            return
        old = row.get(rank)
        row[rank] = rec  # type: ignore[index]  # a StepRow here
        if isinstance(row, StepRow):
            row.stats = None  # a late rank changes the step's statistics
            # the latest and earliest ends over its ranks (recomputed when the record replaced was one)
            if old is not None and (old.t >= row.t_max or old.t <= row.t_min):
                row.t_max = max(r.t for r in row.values())
                row.t_min = min(r.t for r in row.values())
            else:
                if rec.t > row.t_max:
                    row.t_max = rec.t
                if rec.t < row.t_min:
                    row.t_min = rec.t
        self._memo = None
        self.ranks.add(rank)
        if rec.t > self.newest_t:
            self.newest_t = rec.t

    def _freeze(self) -> None:
        """Freeze the record rows older than the newest ``_HOT_ROWS`` steps (one per new step, as a rule)."""
        if len(self.steps) <= _HOT_ROWS:
            return
        for i, s in enumerate(reversed(self.steps)):
            if i < _HOT_ROWS:
                continue
            row = self.steps[s]
            if not isinstance(row, StepRow):
                continue  # frozen already (a late step, sorted in, may have left a record row behind it)
            frozen = self.steps[s] = FrozenRow(row, self)
            if row.stats is not None:  # its statistics move with it (the bounded list names the new row)
                self._with_stats = deque(frozen if r is row else r for r in self._with_stats)

    def kept_stats(self, row: Any) -> None:
        """Called when ``row`` first holds statistics: keeps at most ``_STATS_ROWS`` rows' worth per job."""
        self._with_stats.append(row)
        while len(self._with_stats) > _STATS_ROWS:
            old = self._with_stats.popleft()
            # A row whose statistics were emptied by a late record stays in the list, and is appended
            # again when it keeps statistics anew: its stale entry must not empty what it keeps now
            # (keep_stat would then write into None: a rule failing for the tick).
            if old is not row:
                old.stats = None

    def complete(self, now: float, coverage: float = 0.9) -> list[tuple[int, Mapping[int, StepRec]]]:
        """Steps every (``coverage`` of the) reporting ranks ended by ``now``, oldest first.

        A step still missing ranks is left out until they report, so the slowest rank of a step
        is never judged on the fast ranks alone.
        """
        if self._memo is not None and self._memo[:2] == (now, coverage):
            return self._memo[2]
        need = max(1, math.ceil(coverage * len(self.ranks)))
        out = []
        for s, row in self.steps.items():
            if len(row) >= need and row_end(row) <= now:
                out.append((s, row))
        self._memo = (now, coverage, out)
        return out


def select(steps: Sequence[tuple[int, Mapping[int, StepRec]]], now: float, window_s: float, min_steps: int
           ) -> tuple[list[tuple[int, Mapping[int, StepRec]]], list[tuple[int, Mapping[int, StepRec]]]]:
    """Split complete steps into ``(window, history)``.

    The window holds the steps that ended in the last ``window_s`` seconds, but at least the last
    ``min_steps`` steps, whichever is longer: 50 ms steps are judged over seconds, 5-minute steps
    over steps.  The history is every older step.
    """
    n = 0
    for _, row in reversed(steps):  # newest first: stop at the first step older than the window
        if n >= min_steps and row_end(row) <= now - window_s:
            break
        n += 1
    return list(steps[len(steps) - n:]), list(steps[:len(steps) - n])


def lower_quartile(values: Sequence[float]) -> float:
    """The 25th percentile (inclusive method), or the minimum for fewer than 4 values."""
    s = sorted(values)
    if len(s) < 4:
        return s[0]
    pos = 0.25 * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def groups_of(ranks: Iterable[int], coords: Mapping[int, Mapping[str, float]], by: str) -> dict[str, list[int]]:
    """Ranks that do comparable work: all of them, or (``by == "stage"``) those of one pipeline stage.

    Pipeline stages do different work by design, so a rank is compared with the same stage on the
    other replicas.  Ranks without coordinates form one group.
    """
    ranks = tuple(ranks)
    return per_coords(_GROUPS, (by, ranks), coords, lambda: _groups(ranks, coords, by))  # type: ignore[no-any-return]


def _groups(ranks: tuple[int, ...], coords: Mapping[int, Mapping[str, float]], by: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in sorted(ranks):
        key = ""
        if by == "stage":
            pp = (coords.get(r) or {}).get("pp")
            key = "" if pp is None else str(int(pp))
        out.setdefault(key, []).append(r)
    return out


def per_coords(cache: dict[int, tuple[Any, Any, Any]], key: Any, coords: Any, build: Callable[[], Any]) -> Any:
    """``build()``, kept in ``cache`` for one job's coordinates object and ``key``.

    For what the step rules derive from a job's coordinates on every tick (its groups, its pipeline
    layout): a placement brings a new coordinates object (immutable), so its identity says when to
    build again.  The kept value holds the object, so its id is not reused while kept; the cache holds
    the latest 64.  Callers only read what it returns.
    """
    kept = cache.get(id(coords))
    if kept is not None and kept[0] is coords and kept[1] == key:
        return kept[2]
    out = build()
    if len(cache) >= 64:
        cache.pop(next(iter(cache)))
    cache[id(coords)] = (coords, key, out)
    return out


_GROUPS: dict[int, tuple[Any, Any, Any]] = {}  # groups_of's, by coordinates object (see per_coords)


# The median absolute deviation of the lower half of a normal sample, in units of the whole sample's
# standard deviation: that half's median is at -0.674 sd, and half of it lies within 0.399 sd of that.
_HALF_MAD = 0.3991


def fast_sigma(fast: Sequence[float], centre: float) -> float:
    """The noise (standard deviation) of a group's values, estimated from its fast half alone.

    ``fast`` are the values at or below the group's median and ``centre`` their median.  The fast
    half is used because up to half the ranks may be slow; but it is only half a distribution, and
    its own spread (1.4826 x MAD) is 0.59 of the whole's.  Read as the whole's, it made the largest
    of 64 healthy ranks stand 5 "spreads" out by chance, whenever the step was noisy.  This scales
    the half's MAD back to the whole's standard deviation (exact for normal noise).
    """
    return statistics.median(abs(x - centre) for x in fast) / _HALF_MAD


_FIELDS = ("rank", "group", "ratio", "slow_share", "z", "history_ratio", "value", "reference", "slow_at",
           "history_spread", "ratios", "ratio_at")


class _Block:
    """One group's window matrices, shared by its ranks' judgements (see :class:`RankJudgement`)."""

    __slots__ = ("used", "have", "ratio", "slow", "_lists")

    def __init__(self, used: list[int], have: np.ndarray, ratio: np.ndarray, slow: np.ndarray) -> None:
        self.used, self.have, self.ratio, self.slow = used, have, ratio, slow
        self._lists: tuple[list[list[bool]], list[list[float]], list[list[bool]]] | None = None

    def per_step(self, c: int) -> tuple[frozenset[int], tuple[float, ...], dict[int, float]]:
        """Member ``c``'s slow steps, ratios and ratios by window index."""
        if self._lists is None:  # per rank, as Python lists: they read faster than numpy indexing rank by rank
            self._lists = (self.have.T.tolist(), self.ratio.T.tolist(), self.slow.T.tolist())
        have_t, ratio_t, slow_t = self._lists
        hv, rr, sl, used = have_t[c], ratio_t[c], slow_t[c], self.used
        w = len(used)
        at = [used[k] for k in range(w) if hv[k]]
        xs = [rr[k] for k in range(w) if hv[k]]
        return frozenset(used[k] for k in range(w) if sl[k]), tuple(xs), dict(zip(at, xs, strict=True))


class RankJudgement:
    """How one rank compares with its group over the window.

    Made by :func:`judge_ranks` for every rank on every tick, and most are read for ``ratio``,
    ``z`` and ``slow_share`` alone (a healthy rank fails the first test).  Its per-step fields
    (``slow_at``, ``ratios``, ``ratio_at``) are therefore built on first use from the group's
    matrices: at 10,240 ranks building them for every rank was most of a straggler rule's tick.
    Compares equal to a judgement built with the same values given outright.
    """

    __slots__ = ("rank", "group", "ratio", "slow_share", "z", "history_ratio", "value", "reference",
                 "history_spread", "_slow_at", "_ratios", "_ratio_at", "_src")

    def __init__(self, rank: int, group: str, ratio: float, slow_share: float, z: float,
                 history_ratio: float | None, value: float, reference: float,
                 slow_at: frozenset[int] = frozenset(), history_spread: float | None = None,
                 ratios: tuple[float, ...] = (), ratio_at: Mapping[int, float] | None = None,
                 *, src: tuple[_Block, int] | None = None) -> None:
        self.rank = rank
        self.group = group
        self.ratio = ratio  # median over the window's steps of (its measure / the group's lower quartile)
        self.slow_share = slow_share  # share of the window's steps in which it passed both thresholds
        self.z = z  # median over the steps of its robust z against the step's fast group
        self.history_ratio = history_ratio  # the same ratio over the history steps, when there are enough
        self.value = value  # its median measure over the window
        self.reference = reference  # the group's median lower quartile over the window
        # The rank's own step-to-step spread of that ratio over the history (1.4826 x MAD), when there is
        # one: a rank always 2x slower wanders by more than a fast one, so its growth is judged in its units.
        self.history_spread = history_spread
        self._src = src
        self._slow_at: frozenset[int] | None = None if src else slow_at
        self._ratios: tuple[float, ...] | None = None if src else ratios
        self._ratio_at: Mapping[int, float] | None = None if src else ratio_at

    def _fill(self) -> None:
        assert self._src is not None
        block, c = self._src
        self._slow_at, self._ratios, self._ratio_at = block.per_step(c)
        self._src = None

    @property
    def slow_at(self) -> frozenset[int]:
        """Indexes (into the window) of the steps it was slow on."""
        if self._src is not None:
            self._fill()
        return self._slow_at  # type: ignore[return-value]

    @property
    def ratios(self) -> tuple[float, ...]:
        """Its ratio on each step of the window it reported (window order)."""
        if self._src is not None:
            self._fill()
        return self._ratios  # type: ignore[return-value]

    @property
    def ratio_at(self) -> Mapping[int, float] | None:
        """The same ratios, by index into the window."""
        if self._src is not None:
            self._fill()
        return self._ratio_at

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in _FIELDS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RankJudgement) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaced

    def __repr__(self) -> str:
        return "RankJudgement(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in _FIELDS) + ")"


def _median(sorted_vals: Sequence[float] | np.ndarray) -> float:
    """:func:`statistics.median` of values already sorted (the same arithmetic, so the same float)."""
    n = len(sorted_vals)
    i = n // 2
    return float(sorted_vals[i]) if n % 2 else (float(sorted_vals[i - 1]) + float(sorted_vals[i])) / 2


def _col_medians(m: np.ndarray, have: np.ndarray) -> np.ndarray:
    """Per column of ``m``, the median of its entries where ``have`` (NaN for a column without any).

    :func:`statistics.median` column by column: the middle value, or the mean of the two middle
    ones computed as ``(a + b) / 2``, so each result is the very float the per-rank loop gave.
    """
    n = have.sum(axis=0)
    srt = np.sort(np.where(have, m, np.inf), axis=0)  # absent entries sort last
    out = np.full(m.shape[1], np.nan)
    ok = n > 0
    if not ok.any():
        return out
    cols = np.nonzero(ok)[0]
    k = n[ok]
    hi = srt[k // 2, cols]
    lo = srt[(k - 1) // 2, cols]
    out[ok] = np.where(k % 2 == 1, hi, (lo + hi) / 2)
    return out


# A step of a group that cannot be judged (too few ranks with the measure, or no positive reference).
_SKIP: tuple[Any, ...] = ()
# Group member lists -> a small id, so per-step statistics are keyed without hashing the whole list on each
# lookup.  Ids are never reused (a step's statistics under an id always mean the same members).
_GROUP_IDS: dict[tuple[int, ...], int] = {}
_NEXT_ID = itertools.count()


def _group_id(members: Sequence[int]) -> int:
    key = tuple(members)
    gid = _GROUP_IDS.get(key)
    if gid is None:
        if len(_GROUP_IDS) >= 4096:  # bounded: jobs come and go (a forgotten list just gets a new id)
            _GROUP_IDS.clear()
        gid = _GROUP_IDS[key] = next(_NEXT_ID)
    return gid


def groups_key(groups: Mapping[str, Sequence[int]]) -> tuple[Any, ...]:
    """A small key naming ``groups`` (their names and member lists), for what a condition keeps on a step per
    groups (:func:`kept_stat`): member lists map to ids that are never reused."""
    return tuple((g, _group_id(m)) for g, m in groups.items())


def _step_stats(row: Mapping[int, StepRec], members: Sequence[int], measure: str, min_group: int,
                key: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """One step judged within one group: ``(positions, values, ratios, z, reference)`` or ``_SKIP``.

    ``positions`` index ``members`` (the ranks with the measure at this step).  A rank's ratio is its
    measure over the group's lower quartile; its z is that ratio against the step's fast group (the
    ranks at or below the median ratio): how far from their median, in units of their spread scaled
    to the whole group's (:func:`fast_sigma`), floored at 0.02.  Kept on the row (``StepRow.stats``)
    under ``key``: the same step is judged again on each tick while it is in a window or a history.
    """
    stats = row.stats if isinstance(row, StepRows) else None
    if stats is not None and key is not None:
        got = stats.get(key)
        if got is not None:
            return got  # type: ignore[no-any-return]
    pos: list[int] = []
    vals: list[float] = []
    if isinstance(row, FrozenRow):
        line = row.of(members, measure)
        have = np.nonzero(~np.isnan(line))[0]
        pos, vals = have.tolist(), line[have].tolist()
    else:
        for i, r in enumerate(members):
            rec = row.get(r)
            if rec is not None:
                v = rec.get(measure)
                if v is not None:
                    pos.append(i)
                    vals.append(v)
    out: tuple[Any, ...] = _SKIP
    if len(vals) >= min_group:
        ref = lower_quartile(vals)
        if ref > 0:
            values = np.array(vals, np.float64)
            ratios = values / ref
            srt = np.sort(ratios)
            centre = _median(srt)
            fast = srt[srt <= centre]  # sorted: the fast group
            fmed = _median(fast)
            scale = max(_median(np.sort(np.abs(fast - fmed))) / _HALF_MAD, 0.02)
            out = (np.array(pos, np.int64), values, ratios, (ratios - fmed) / scale, ref)
    if key is not None:
        keep_stat(row, key, out)
    return out


def kept_stat(row: Mapping[int, StepRec], key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
    """What ``compute()`` gives for the step ``row``, kept on it under ``key`` (:func:`keep_stat`).

    Called by the step conditions for what one step says, which they read again on every tick the
    step stays in a window or a history (at 10,240 ranks each answer reads every rank's record).
    """
    stats = getattr(row, "stats", None)
    if stats is not None and key in stats:
        return stats[key]
    out = compute()
    keep_stat(row, key, out)
    return out


def keep_stat(row: Mapping[int, StepRec], key: tuple[Any, ...], value: Any) -> None:
    """Keep ``value`` on the step ``row`` under ``key`` (a no-op for a plain dict of records).

    Called by the step conditions for what they compute of one step and read again on later ticks;
    a record added to the step empties what was kept, and only the latest ``_STATS_ROWS`` steps of
    a job keep anything.
    """
    if not isinstance(row, StepRows):
        return
    if row.stats is None:
        row.stats = {}
        if row.table is not None:
            row.table.kept_stats(row)
    row.stats[key] = value


class _Part:
    """One group's share of a :class:`JudgedRanks`: its window matrices, per-member medians and history lines."""

    __slots__ = ("group", "members", "present", "block", "meds", "z_med", "v_med", "n_slow", "n_have", "ref_med",
                 "lines", "min_history", "_hist")

    def __init__(self, group: str, members: list[int], present: np.ndarray, block: _Block, meds: np.ndarray,
                 z_med: np.ndarray, v_med: np.ndarray, n_slow: np.ndarray, n_have: np.ndarray, ref_med: float,
                 lines: Callable[[], list[tuple[Any, ...]]], min_history: int) -> None:
        self.group, self.members, self.present, self.block = group, members, present, block
        self.meds, self.z_med, self.v_med, self.n_slow, self.n_have = meds, z_med, v_med, n_slow, n_have
        self.ref_med, self.lines, self.min_history = ref_med, lines, min_history
        self._hist: tuple[list[float | None], list[float | None]] | None = None

    def history(self) -> tuple[list[float | None], list[float | None]]:
        """Per member (member order): its history ratio and spread, None where it has too little history."""
        if self._hist is None:
            hl = self.lines()
            m = len(self.members)
            h_have = np.zeros((len(hl), m), bool)
            h_ratio = np.zeros((len(hl), m))
            for k, st in enumerate(hl):
                h_have[k, st[0]] = True
                h_ratio[k, st[0]] = st[2]
            h_n = h_have.sum(axis=0)
            h_med = _col_medians(h_ratio, h_have)
            h_spread = 1.4826 * _col_medians(np.abs(h_ratio - h_med), h_have)
            h_med_l, h_spread_l, h_n_l = h_med.tolist(), h_spread.tolist(), h_n.tolist()
            hm = [h_med_l[c] if h_n_l[c] >= self.min_history and h_n_l[c] else None for c in range(m)]
            self._hist = hm, [h_spread_l[c] if hm[c] is not None else None for c in range(m)]
        return self._hist


class JudgedRanks:
    """Every rank :func:`judge_window` judged, as arrays in the order :func:`judge_ranks` lists them.

    ``rank``, ``ratio``, ``z`` and ``slow_share`` hold every judged rank (what a condition screens all
    ranks on); a :class:`RankJudgement` is built only for a rank asked for (:meth:`judgement`), and the
    history figures (a sort of the history's steps x ranks) only when one is.  Why: at 1,024 ranks
    building a judgement and the history medians of every rank on every tick was most of the
    straggler rule's cost, and all but a few ranks fail the first test.
    """

    def __init__(self, parts: list[_Part], ratio_thr: float) -> None:
        self._parts = parts
        self.ratio_thr = ratio_thr

        def cat(xs: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(xs) if xs else np.zeros(0)

        self.rank = cat([np.asarray(p.members, np.int64)[p.present] for p in parts]).astype(np.int64)
        self.ratio = cat([p.meds[p.present] for p in parts])
        self.z = cat([p.z_med[p.present] for p in parts])
        self.slow_share = cat([p.n_slow[p.present] / p.n_have[p.present] for p in parts])
        # index i -> (part, member column)
        self._where = [(p, int(c)) for p in parts for c in p.present.tolist()]
        self._made: dict[int, RankJudgement] = {}

    def __len__(self) -> int:
        return len(self._where)

    def judgement(self, i: int) -> RankJudgement:
        """The :class:`RankJudgement` of the ``i``-th judged rank (made once)."""
        got = self._made.get(i)
        if got is None:
            p, c = self._where[i]
            hm, hs = p.history()
            got = self._made[i] = RankJudgement(
                p.members[c], p.group, float(p.meds[c]), int(p.n_slow[c]) / int(p.n_have[c]), float(p.z_med[c]),
                hm[c], float(p.v_med[c]), p.ref_med, history_spread=hs[c], src=(p.block, c))
        return got

    def all(self) -> list[RankJudgement]:
        """Every judgement, in order (builds them all)."""
        return [self.judgement(i) for i in range(len(self))]

    def _with_history(self) -> list[tuple[_Part, np.ndarray, np.ndarray]]:
        """Per group: its present member columns and their history ratio (NaN: none) in that order."""
        out = []
        for p in self._parts:
            hm = p.history()[0]
            cols = p.present
            out.append((p, cols, np.array([math.nan if hm[c] is None else hm[c] for c in cols.tolist()])))
        return out

    def growth_noise(self) -> dict[int, tuple[float, float]]:
        """Per window step (index): the typical growth of the ranks with a past (the median of each one's
        ratio over its history ratio) and its noise (1.4826 x the MAD of growth over the typical, at
        least 0.02); steps with fewer than 4 such ranks left out, and nothing under 4 such ranks in all.

        What ``step_outlier`` judges a rank's growth against: the same floats as a loop over the ranks'
        judgements with :func:`statistics.median`.
        """
        lines: dict[int, list[np.ndarray]] = {}
        n = 0
        for p, cols, h in self._with_history():
            use = ~np.isnan(h) & (h != 0)  # a history ratio that is truthy
            if not use.any():
                continue
            n += int(use.sum())
            cols, h = cols[use], h[use]
            b = p.block
            for k, i in enumerate(b.used):
                have = b.have[k, cols]
                if have.any():
                    lines.setdefault(i, []).append((b.ratio[k, cols] / h)[have])
        out: dict[int, tuple[float, float]] = {}
        if n < 4:
            return out
        for i, parts in lines.items():
            gs = np.sort(np.concatenate(parts))
            if len(gs) < 4:
                continue
            typ = _median(gs)
            if typ <= 0:
                continue
            dev = np.sort(np.abs(gs / typ - 1.0))
            out[i] = (typ, max(1.4826 * _median(dev), 0.02))
        return out

    def newly_slow_steps(self, skip: set[int]) -> set[int]:
        """Window steps (indices) on which a rank not in ``skip`` was slow, and slower than ``ratio_thr`` times its
        history ratio (any ratio, for a rank without one)."""
        out: set[int] = set()
        for p, cols, h in self._with_history():
            keep = np.array([p.members[c] not in skip for c in cols.tolist()], bool)
            if not keep.any():
                continue
            cols, h = cols[keep], h[keep]
            b = p.block
            if not len(b.used):
                continue
            slow = b.slow[:, cols]
            with np.errstate(invalid="ignore"):
                newly = slow & (np.isnan(h)[None, :] | (b.ratio[:, cols] > (h * self.ratio_thr)[None, :]))
            out.update(b.used[k] for k in np.nonzero(newly.any(axis=1))[0].tolist())
        return out


def judge_ranks(window: Sequence[tuple[int, Mapping[int, StepRec]]],
                history: Sequence[tuple[int, Mapping[int, StepRec]]],
                groups: Mapping[str, list[int]], measure: str, ratio_thr: float, min_history: int,
                min_group: int = 2, z_thr: float = 4.0) -> list[RankJudgement]:
    """Every rank's :class:`RankJudgement` (:func:`judge_window`, each judgement built)."""
    return judge_window(window, history, groups, measure, ratio_thr, min_history, min_group, z_thr).all()


def judge_window(window: Sequence[tuple[int, Mapping[int, StepRec]]],
                 history: Sequence[tuple[int, Mapping[int, StepRec]]],
                 groups: Mapping[str, list[int]], measure: str, ratio_thr: float, min_history: int,
                 min_group: int = 2, z_thr: float = 4.0) -> JudgedRanks:
    """Compare every rank with its group on each step of the window (and of the history).

    Per step, each rank's ratio to the group's lower quartile and its robust z against that step's
    fast group; a rank is *slow on a step* when both pass.  Its judgement is the median over the
    window's steps of the ratio and of the z, and the share of steps it was slow on.

    Called by the step-aligned conditions on every tick for every job.  Each step's statistics are
    computed once (:func:`_step_stats`, kept on the step) and the medians over steps are taken for
    every rank at once (numpy over steps x ranks), with the same arithmetic as a rank-by-rank loop.
    Returns them as arrays (:class:`JudgedRanks`); the history is read only when a judgement is asked for.
    """
    parts: list[_Part] = []
    for g, members in groups.items():
        if len(members) < min_group:
            continue
        m = len(members)
        key = (measure, _group_id(members), min_group)
        # The window: one line per step that could be judged, one column per member.
        used: list[int] = []  # window index of each judged step
        refs: list[float] = []
        lines: list[tuple[Any, ...]] = []
        for i, (_, row) in enumerate(window):
            st = _step_stats(row, members, measure, min_group, key)
            if st is _SKIP:
                continue
            used.append(i)
            refs.append(st[4])
            lines.append(st)
        w = len(lines)
        have = np.zeros((w, m), bool)
        ratio = np.zeros((w, m))
        value = np.zeros((w, m))
        zed = np.zeros((w, m))
        for k, (pos, vals, ratios, z, _) in enumerate(lines):
            have[k, pos] = True
            ratio[k, pos] = ratios
            value[k, pos] = vals
            zed[k, pos] = z
        slow = have & (ratio >= ratio_thr) & (zed >= z_thr)
        n_have = have.sum(axis=0)
        present = np.nonzero(n_have > 0)[0]  # members with at least one judged step (in member order)
        if len(present) < min_group:
            continue

        def history_lines(members: list[int] = members, key: tuple[Any, ...] = key) -> list[tuple[Any, ...]]:
            # The history: ratios only.
            return [st for _, row in history
                    if (st := _step_stats(row, members, measure, min_group, key)) is not _SKIP]

        parts.append(_Part(g, members, present, _Block(used, have, ratio, slow), _col_medians(ratio, have),
                           _col_medians(zed, have), _col_medians(value, have), slow.sum(axis=0), n_have,
                           _median(sorted(refs)) if refs else 0.0, history_lines, min_history))
    return JudgedRanks(parts, ratio_thr)


def rank_matrix(rows: Sequence[tuple[int, Mapping[int, StepRec]]], ranks: Sequence[int], measure: str) -> np.ndarray:
    """Steps x ranks: each step's ``measure`` per rank, NaN where a rank did not report it.

    Called by the ``rotation`` condition on every tick for its window.  A step's line is kept on the
    step (``StepRow.stats``, emptied when a record is added): it stays in the window for many ticks,
    and reading every rank's record again on each cost as much as the judgement itself.
    """
    key = ("line", measure, _group_id(ranks))
    out = np.full((len(rows), len(ranks)), np.nan)
    for i, (_, row) in enumerate(rows):
        stats = row.stats if isinstance(row, StepRows) else None
        line = stats.get(key) if stats is not None else None
        if line is None:
            line = column_of(row, ranks, measure)
            keep_stat(row, key, line)
        out[i] = line
    return out


def column_medians(m: np.ndarray) -> np.ndarray:
    """Per column of ``m``, the median of its non-NaN entries (NaN for a column with none); the very
    floats :func:`statistics.median` gives."""
    have = ~np.isnan(m)
    return _col_medians(np.where(have, m, 0.0), have)


def _turn_of(known: Sequence[float]) -> tuple[float, float, int] | None:
    """One step's slow turn within one group, from its ranks' values (member order): ``(ratio to the
    lower quartile, robust z against the fast ranks, position of the slowest)``; None under 4 values."""
    if len(known) < 4:
        return None
    vals = sorted(known)
    ref = lower_quartile(vals)
    centre = statistics.median(vals)
    fast = [v for v in vals if v <= centre]
    fmed = statistics.median(fast)
    scale = max(1.4826 * statistics.median(abs(v - fmed) for v in fast), 0.02 * ref, 1e-9)
    top = max(range(len(known)), key=lambda i: known[i])
    return (known[top] / ref if ref > 0 else 0.0), (known[top] - fmed) / scale, top


def _sorted_medians(srt: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per line of ``srt`` (sorted ascending), the median of its first ``k`` entries."""
    rows = np.arange(len(srt))
    hi = srt[rows, k // 2]
    lo = srt[rows, (k - 1) // 2]
    out: np.ndarray = np.where(k % 2 == 1, hi, (lo + hi) / 2)
    return out


def _row_medians(x: np.ndarray) -> np.ndarray:
    """Per line of ``x``, the median of its non-NaN entries (NaN for a line with none)."""
    out = np.full(x.shape[0], np.nan)
    full = ~np.isnan(x).any(axis=1)
    if full.any():
        out[full] = np.median(x[full], axis=1)
    for i in np.nonzero(~full)[0].tolist():
        k = x[i][~np.isnan(x[i])]
        if len(k):
            out[i] = float(np.median(k))
    return out


def _quartiles(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per line of ``y`` (at least one non-NaN entry each), its lower and upper quartiles (linear, as
    :func:`numpy.percentile`); complete lines at once, the others one by one."""
    q25 = np.empty(len(y))
    q75 = np.empty(len(y))
    full = ~np.isnan(y).any(axis=1)
    if full.any():
        srt = np.sort(y[full], axis=1)
        n = srt.shape[1]
        rows = np.arange(len(srt))
        for q, out in ((0.25, q25), (0.75, q75)):
            pos = q * (n - 1)
            lo = int(pos)
            hi = min(lo + 1, n - 1)
            out[full] = srt[rows, lo] + (srt[rows, hi] - srt[rows, lo]) * (pos - lo)
    for i in np.nonzero(~full)[0].tolist():
        k = y[i][~np.isnan(y[i])]
        q25[i], q75[i] = np.percentile(k, [25.0, 75.0])
    return q25, q75


def _usable(members: Sequence[int] | np.ndarray, ok_usual: np.ndarray) -> np.ndarray:
    """The columns of ``members`` (in their order) whose rank has a usual level: one mask, not a loop over
    every member in Python (the rotation asks it of 1,024 ranks several times a tick)."""
    cols = np.asarray(members, np.int64)
    return cols[ok_usual[cols]] if len(cols) else cols


def spread_lines(vals: np.ndarray, usual: np.ndarray,
                 groups: Sequence[Sequence[int] | np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step (line of ``vals``, steps x ranks): how widely its ranks' work is spread, and its slowest rank.

    Called by the ``rotation`` condition for its window and for the job's past (the level a spread is
    judged against).  Each rank's value is taken over its ``usual`` level (so an older GPU's steady
    excess is no spread), then over its group's median that step (so stages are compared with their
    own kind and a slower step of the whole job is no spread), and pooled over the groups of 4 or
    more.  Returns ``(interquartile range of the pooled values, the slowest one over the pooled lower
    quartile, the slowest one's column)``: NaN, NaN, -1 for a step with fewer than 4 values.  Lines
    where every rank reported (nearly all) are done at once by sorting; numpy's NaN-aware quantiles
    cost ten times as much and made this the evaluator's most expensive step.
    """
    n_steps = vals.shape[0]
    disp = np.full(n_steps, np.nan)
    ratio = np.full(n_steps, np.nan)
    col = np.full(n_steps, -1, np.int64)
    ok_usual = ~np.isnan(usual) & (usual != 0)
    parts: list[np.ndarray] = []
    part_cols: list[np.ndarray] = []
    with np.errstate(all="ignore"):
        for members in groups:
            cols = _usable(members, ok_usual)
            if len(cols) < 4:
                continue
            x = vals[:, cols] / usual[cols]
            med = _row_medians(x)
            parts.append(x / np.where(med > 0, med, np.nan)[:, None])
            part_cols.append(cols)
    if not parts:
        return disp, ratio, col
    pooled = np.concatenate(parts, axis=1)
    where = np.concatenate(part_cols)
    good = (~np.isnan(pooled)).sum(axis=1) >= 4
    if not good.any():
        return disp, ratio, col
    y = pooled[good]
    q25, q75 = _quartiles(y)
    top = np.argmax(np.where(np.isnan(y), -np.inf, y), axis=1)
    topv = y[np.arange(len(y)), top]
    disp[good] = q75 - q25
    ratio[good] = np.where(q25 > 0, topv / np.where(q25 > 0, q25, 1.0), np.nan)
    col[good] = where[top]
    return disp, ratio, col


def slow_turns(vals: np.ndarray, usual: np.ndarray, groups: Sequence[Sequence[int] | np.ndarray], is_ratio: Any,
               is_z: Any) -> list[tuple[float, int] | None]:
    """Per step (line of ``vals``, steps x ranks), its slow turn: ``(ratio, column)`` of the group's slowest
    rank when its ratio passes ``is_ratio`` and its z ``is_z`` (the largest ratio over the groups), else None.

    Each rank's value is first taken over its ``usual`` level (a rank with no usual level, or 0, is left
    out); then, per group (column indices), the slowest against the group's lower quartile (ratio) and
    against the fast half's median in units of its spread (1.4826 x MAD, at least 2% of the quartile):
    :func:`_turn_of`.  Called by the ``rotation`` condition on every tick for the steps of its window:
    lines where every member reported are judged all at once (numpy), the others one by one, with the
    same arithmetic, so the result is the very one the step-by-step loop gave.
    """
    n_steps = vals.shape[0]
    best: list[tuple[float, int] | None] = [None] * n_steps
    ok_usual = ~np.isnan(usual) & (usual != 0)
    for members in groups:
        cols = _usable(members, ok_usual)
        if len(cols) < 4:
            continue
        x = vals[:, cols] / usual[cols]
        full = ~np.isnan(x).any(axis=1)
        got: list[tuple[float, float, int] | None] = [None] * n_steps
        if full.any():
            xf = x[full]
            n = xf.shape[1]
            srt = np.sort(xf, axis=1)
            pos = 0.25 * (n - 1)
            lo = int(pos)
            ref = srt[:, lo] + (srt[:, min(lo + 1, n - 1)] - srt[:, lo]) * (pos - lo)
            centre = srt[:, n // 2] if n % 2 else (srt[:, n // 2 - 1] + srt[:, n // 2]) / 2
            k = (srt <= centre[:, None]).sum(axis=1)
            fmed = _sorted_medians(srt, k)
            dev = np.abs(srt - fmed[:, None])
            dev[np.arange(n)[None, :] >= k[:, None]] = np.inf
            mad = _sorted_medians(np.sort(dev, axis=1), k)
            scale = np.maximum(np.maximum(1.4826 * mad, 0.02 * ref), 1e-9)
            top = np.argmax(xf, axis=1)  # the first of equal maxima, in member order, as max() gives
            topv = xf[np.arange(len(xf)), top]
            safe = np.where(ref > 0, ref, 1.0)
            q = np.where(ref > 0, topv / safe, 0.0)
            z = (topv - fmed) / scale
            for i, qi, zi, ti in zip(np.nonzero(full)[0].tolist(), q.tolist(), z.tolist(), top.tolist(), strict=True):
                got[i] = (qi, zi, ti)
        for i in np.nonzero(~full)[0].tolist():
            line = x[i]
            keep = ~np.isnan(line)
            t = _turn_of(line[keep].tolist())
            if t is not None:
                got[i] = (t[0], t[1], int(np.nonzero(keep)[0][t[2]]))
        for i, g in enumerate(got):
            if g is not None and is_ratio(g[0]) and is_z(g[1]):
                b = best[i]
                if b is None or g[0] > b[0]:
                    best[i] = (g[0], int(cols[g[2]]))
    return best


def phase_excess(window: Sequence[tuple[int, Mapping[int, StepRec]]], ranks: Sequence[int], peers: Sequence[int],
                 phases: Sequence[str] = ("compute_s", "data_wait_s", "comm_s")) -> dict[str, tuple[float, float]]:
    """Per phase, ``(the culprits' median, the peers' median)`` over the window; unknown phases left out."""
    out: dict[str, tuple[float, float]] = {}
    for ph in phases:
        mine = [v for _, row in window for v in known(row, ranks, ph)]
        theirs = [v for _, row in window for v in known(row, peers, ph)]
        if mine and theirs:
            out[ph] = (statistics.median(mine), statistics.median(theirs))
    return out


def step_loss(row: Mapping[int, StepRec], culprits: set[int], groups: Mapping[str, list[int]],
              measure: str = "work") -> tuple[float, float]:
    """``(step time, seconds of it lost to the culprits)`` for one step.

    In a synchronous job the step ends when the slowest rank's work is done, so the step would be
    shorter by how far the culprits' work exceeds the slowest *other* rank of their group.

    In a pipeline (``groups`` are its stages) a rank is compared with its own stage to be *named*
    (stages do different work by design), but what the step would take without it is set by the
    whole pipeline: every microbatch moves at the pace of the slowest rank of any stage, and the
    all-reduce waits for the slowest replica.  Were the culprits as fast as their stage's other
    replicas, the slowest stage would set the pace as it did before, so only the culprits' excess
    over the slowest *non-culprit rank of the job* is lost (a straggler on a light stage behind a
    bottleneck stage costs only what it adds over the bottleneck, often nothing).  Comparing with
    their own stage alone charged the bottleneck's own time to them (5-10x the true cost).  Where
    every rank reports its pipeline wait, the pipelined time (last input to drain) scales with the
    slowest rank's compute (:func:`pipelined_s`): the loss is that time times 1 - the slowest other
    rank's compute / the culprits' (a stage's work takes m + p - 1 microbatch slots, not m), plus
    any excess of their input wait (paid once, before the pipeline starts).
    """
    dur = row_median(row)
    lost = 0.0
    for members in groups.values():
        mine = known(row, [r for r in members if r in culprits], measure)
        others = known(row, [r for r in members if r not in culprits], measure)
        if mine and others:
            lost = max(lost, max(mine) - max(others))
    if len(groups) > 1 and lost > 0:  # pipeline stages: the whole pipeline sets the pace
        ranks = [r for members in groups.values() for r in members]
        paced = _pipeline_step_loss(row, ranks, culprits, measure)
        if paced is not None:
            lost = paced
    return dur, max(0.0, min(lost, dur))


def _pipeline_step_loss(row: Mapping[int, StepRec], ranks: Sequence[int], culprits: set[int], measure: str
                        ) -> float | None:
    """What the culprits cost a pipeline's step: their excess over the slowest other rank of any stage
    (see :func:`step_loss`), scaled to the pipelined time where the split says it."""
    mine_r = [r for r in ranks if r in culprits]
    others_r = [r for r in ranks if r not in culprits]
    mine, others = known(row, mine_r, measure), known(row, others_r, measure)
    if not mine or not others:
        return None
    flat = max(0.0, max(mine) - max(others))
    if measure != "work":
        return flat
    pipe = pipelined_s(row, ranks)
    comp_m, comp_o = known(row, mine_r, "compute_s"), known(row, others_r, "compute_s")
    if pipe is None or not comp_m or not comp_o or max(comp_m) <= 0:
        return flat
    wait_m = known(row, mine_r, "data_wait_s")
    wait_o = known(row, others_r, "data_wait_s")
    waited = max(0.0, max(wait_m) - max(wait_o)) if wait_m and wait_o else 0.0
    return pipe * max(0.0, 1.0 - max(comp_o) / max(comp_m)) + waited


def pipelined_s(row: Mapping[int, StepRec], ranks: Sequence[int]) -> float | None:
    """The step's pipelined time, from the last rank's input to the last replica's drain; None unless
    every rank reports its compute and pipeline wait.

    A rank is ready for the data-parallel all-reduce when its replica's pipeline drains: its input
    wait, its pipeline wait and its own compute.
    """
    present = [r for r in ranks if r in row]
    if not present:
        return None
    comp, pipe, wait = (column_of(row, present, m) for m in ("compute_s", "pipeline_wait_s", "data_wait_s"))
    if np.isnan(comp).any() or np.isnan(pipe).any():
        return None
    wait = np.nan_to_num(wait, nan=0.0)
    return max(0.0, float((pipe + wait + comp).max()) - float(wait.max()))


# Grid points for the alternative's mixture over rates in :func:`sequential_onset`.
_MIX_POINTS = 64


def sequential_onset(flags: Sequence[bool], past_hits: int, past_steps: int, rate: float, alpha: float) -> int | None:
    """Where a raised rate of events began among the latest steps: how many of them; None when not shown.

    Called by the ``rotation`` condition on each evaluation, with ``flags`` (oldest first) saying which
    steps of its window had a slow turn, and the job's own past: ``past_hits`` such steps among the
    ``past_steps`` before the window.  Each run of latest steps is weighed: the likelihood of its
    flags at a rate of at least ``rate`` (the rotation's rate of slow turns) against their likelihood
    given the past.  When the best run passes 1 / ``alpha``, its length is returned (the change
    point's estimate, which a longer rotation extends as its turns come in); None when no run passes.

    The past rate is not known, only counted, and sixty clean steps do not prove it zero.  So the
    "no change" hypothesis is the *predictive* law of the latest steps given the past count (a
    Beta-Bernoulli with a uniform prior: s hits in m steps have probability B(k+1+s, n-k+1+m-s) /
    B(k+1, n-k+1), order aside), not a plug-in rate.  Nor is the rotation's own rate known, only
    bounded below: uneven batches slow some rank on 80% of steps or on all of them.  So the
    alternative is the mixture of rates uniform on [``rate``, 1] (not ``rate`` itself, which charged
    a rotation that slows every step for the steps it never missed: about one step more).  Each
    likelihood ratio is then a mixture of nonnegative martingales under "no change", itself one, and
    by Ville's inequality the chance that *any* run of latest steps passes 1 / ``alpha`` is at most
    ``alpha`` per evaluation: a false alarm every 1 / ``alpha`` new steps at most, whatever the job's
    size, step time or hiccup rate.  At alpha 1e-6 and ``rate`` 0.8, a clean past of 60 steps needs
    five events in a row, 240 clean steps three; a past with an event on a sixth of 60 steps ten; one
    at ``rate`` over 100 (far more than a window holds); one above it, never.
    """
    if alpha <= 0 or not 0 < rate < 1 or past_steps <= 0 or not flags:
        return None
    a, b = past_hits + 1.0, past_steps - past_hits + 1.0
    if a / (a + b) >= rate:
        # One-sided: a past with events on most steps is no ground for a rise.  (Steps without one
        # would otherwise be evidence *for* ``rate`` against it, and a quiet spell would pass.)
        return None
    m = np.arange(1, len(flags) + 1, dtype=float)
    hits = np.cumsum(np.asarray(flags[::-1], dtype=float))
    # The alternative's likelihood, mixed over rates on [rate, 1]: midpoints of a fine grid (the
    # integrand is smooth; 64 points are within 1% of the integral for the runs a window holds).
    q = rate + (1.0 - rate) * (np.arange(_MIX_POINTS) + 0.5) / _MIX_POINTS
    ll = hits[:, None] * np.log(q)[None, :] + (m - hits)[:, None] * np.log1p(-q)[None, :]
    top = ll.max(axis=1)
    alt = top + np.log(np.exp(ll - top[:, None]).mean(axis=1))
    lg = np.vectorize(math.lgamma, otypes=[float])
    null = lg(a + hits) + lg(b + m - hits) - lg(a + b + m) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    score = alt - null
    best = int(np.argmax(score))
    if score[best] < math.log(1.0 / alpha):
        return None
    return best + 1
