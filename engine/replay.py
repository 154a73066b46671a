"""Replaying recorded telemetry for a postmortem: the live engine's evaluator, offline, in bounded memory.

Called by ``whywait replay`` (from Kafka or from a bundle) and ``whywait export``.
Nothing here imports aiokafka: the Kafka reader in ``whywait.engine.commands.replay_cmd``
and the bundle reader in ``whywait.engine.importers.bundle`` both hand raw records to an
:class:`EventTimeMerge`, which decodes them, drops what is outside the window or
the ``--job``/``--project`` filter, counts what breaks the contract, and yields
the messages in one total event-time order.

That order is what makes a replay deterministic: the output depends only on the
set of messages, never on partition interleaving or batch sizes, because every
message is released in ``(time, kind, topic, canonical bytes)`` order once every
open stream has moved more than ``slack_s`` past it.  Memory is bounded by the
slack (a few seconds of telemetry per stream), not by the length of the range.
Held messages wait in one-second buckets, each sorted when it is released, rather
than in a heap: one sort per second of data costs less than a push and a pop per message.

:func:`replay` drives one or two :class:`~whywait.engine.evaluate.evaluator.Evaluator`
(two for a rule backtest: both see the same messages in one pass) and returns
their diagnoses with the counts of what was skipped and why.
"""

from __future__ import annotations

import heapq
import json
import math
import statistics
from bisect import bisect_left
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Mapping, Sequence

from whywait.agents.events import NODE_KINDS, TOPIC_PLACEMENT, ContractError, decode
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import RuleSet
from whywait.topology.model import Topology, node_name_in

# Placements sort before the telemetry of the same second, so a job is known when its first steps arrive.
_KIND_ORDER = {"placement": 0, "checkpoint": 1, "steps": 2}
# How far past event time ``end`` the evaluator is advanced at the end, to close every window: ticked through
# (never more than the evaluator's ``max_gap_s``, past which it would skip the gap), so the range's last seconds
# are evaluated as the live engine would, and each incident resolves when its keep_firing_for runs out (every
# rule's is under 900 s); one still holding then stays open.  It was an hour, skipped to its last 15 minutes:
# the last seconds of data were never evaluated.
_CLOSE_S = 900.0
# A stream is done once this many valid messages in a row are past the window (plus the slack): one message
# stamped far in the future (a wrong clock, a hostile producer) must not end it, nor where a fetch happened to
# end decide what was read.
_PAST_RUN = 16
# A stream's progress is the median event time of its latest messages, so one outlier does not move it.
_RECENT = 64
# A partition's records produced after the window (its tail) may still hold the window's events: history
# backfilled with ``whywait import``, a simulation of an earlier time.  A tail of at most this many records is
# scanned and its runs of in-window events read; past it, the partition stops after its run of messages past
# the window and the replay says so (``--read-to-end`` scans any tail).
TAIL_SCAN_MAX = 250_000
# A tail with more runs than this (events jumping back in time over and over) has its further runs read as part
# of its last one: they arrive late to the merge (counted, still evaluated) rather than opening a stream each.
_MAX_RUNS = 32


@dataclass(frozen=True)
class Window:
    """What to replay: event times ``since <= t <= until`` (after ``lead_s`` of warm-up) and the filters."""

    since: float
    until: float
    lead_s: float = 0.0
    jobs: frozenset[str] = frozenset()
    projects: frozenset[str] = frozenset()

    @property
    def read_from(self) -> float:
        """First event time read: the window's start minus the warm-up lead-in."""
        return self.since - self.lead_s


class EventTimeMerge:
    """Merges several nearly ordered streams of raw records into one event-time order, in bounded memory.

    Each stream (a Kafka partition, a bundle member) is in offset order, which trails event time by
    at most ``slack_s`` (agents send each interval's sample within it).  The driver asks
    :meth:`want` which stream to read next (the one furthest behind, so streams advance together),
    passes what it read to :meth:`add` (or :meth:`close` at its end) and takes the released
    messages from :meth:`ready`; :meth:`drain` releases the rest at the end.

    Placements are special: the topic is compacted, so a job's placement may be far older than
    the window.  The latest placement of each job at or before the window's start enters at the
    start; later ones enter at their own time.
    """

    def __init__(self, streams: Iterable[str], window: Window, slack_s: float = 30.0) -> None:
        self.window = window
        self.slack_s = slack_s
        self.open: dict[str, float] = {s: -float("inf") for s in streams}
        # Held messages by whole second of event time: (time, kind order, topic, raw bytes, message).  Identical
        # records (a duplicate delivery) decode to equal messages, so the tuples compare equal without ordering them.
        self._buckets: dict[int, list[tuple[float, int, str, bytes, Any]]] = {}
        self._keys: list[int] = []  # heap of the bucket numbers in _buckets
        self.held = 0  # messages waiting in the buckets (what the slack bounds)
        self.released_to = -float("inf")
        self.skipped: Counter[str] = Counter()
        # Messages that reached the merge after it had released later ones by more than the slack (history
        # written to a partition after newer data, within the window): evaluated, but late (see late_note).
        self.late = 0
        self.telemetry = 0  # messages other than placements kept for the window (none: the window missed the data)
        # stream -> offsets where a run of late messages began (given ``offsets`` in :meth:`add`): where the
        # reader splits the partition into streams of their own when it reads the window again (see ``jumps``).
        self.jumps: dict[str, list[int]] = {}
        self._was_late: dict[str, bool] = {}
        self.read = 0
        self.before: dict[str, tuple[float, bytes, Mapping[str, Any]]] = {}  # job -> placement before the start
        self._recent: dict[str, deque[float]] = {}  # stream -> event times of its latest valid messages
        self._past: dict[str, int] = {}  # stream -> valid messages in a row past the window
        self._order: dict[type, tuple[int, bool]] = {}  # message class -> (kind order, is a placement)
        self.placement_projects: dict[str, str] = {}
        # Streams read to a known end (a Kafka partition up to its end offset or a run of it): never closed early.
        self.to_end: set[str] = set()
        # With --job/--project: the jobs that had messages in the window, wanted or not (for "not seen" hints).
        self.seen_jobs: set[str] = set()
        # What the reader wants said beside the counts (a topic missing, a partition not read to its end).
        self.notes: list[str] = []
        # Partitions the reader stopped before their end (``{"partition", "offset", "end"}``), for the stats.
        self.stopped_early: list[dict[str, Any]] = []
        # ``whywait export`` wants the records themselves: with ``raw`` set, ``(topic, bytes)`` pairs are
        # released instead of decoded messages (placements keep their own time).
        self.raw = False

    def want(self) -> str | None:
        """The open stream whose newest event time is the oldest (ties by name); None when all are closed."""
        if not self.open:
            return None
        return min(self.open.items(), key=lambda kv: (kv[1], kv[0]))[0]

    def close(self, stream: str) -> None:
        """Called when ``stream`` has no more records."""
        self.open.pop(stream, None)

    def add(self, stream: str, topic: str, values: Sequence[bytes | None],
            offsets: Sequence[int] | None = None) -> int:
        """Decode ``values`` read from ``stream`` (records of ``topic``), keep those in the window.

        Decisions are taken per message, never per batch, so what is read does not depend on where
        the reader's fetches ended: once :data:`_PAST_RUN` valid messages in a row lie past the
        window and the slack, the stream is closed and the rest of the batch is not looked at
        (unless the stream is in :attr:`to_end`).  Messages past the window do not move the
        stream's progress: what follows them may be the window's again.  Returns how many of
        ``values`` were looked at (all of them unless the stream was closed early).

        With ``offsets`` (each value's offset in its partition), the offset where a run of late
        messages begins is kept in :attr:`jumps`: history written after newer data, which a second
        pass reads as a stream of its own, in order.
        """
        w = self.window
        read_from, until = w.read_from, w.until
        past_at = until + self.slack_s
        filtered = bool(w.jobs or w.projects)
        seen_jobs = self.seen_jobs
        stops = stream not in self.to_end
        recent = self._recent.get(stream)
        if recent is None:
            recent = self._recent[stream] = deque(maxlen=_RECENT)
        past = self._past.get(stream, 0)
        buckets, keys, order_of = self._buckets, self._keys, self._order
        released_to = self.released_to
        n = self.read
        held = late = telemetry = 0
        was_late = self._was_late.get(stream, False)
        jumps = self.jumps.get(stream)
        for n, raw in enumerate(values, start=self.read + 1):  # noqa: B007 - n, the count read, is kept below
            if raw is None:  # a tombstone on a compacted topic
                self.skipped["tombstones"] += 1
                continue
            try:
                msg = decode(raw, topic)
            except ContractError as exc:
                if not _outside(raw, w):  # a broken message of another time is not this window's business
                    self.skipped[f"contract break on {topic}: {_reason(exc)}"] += 1
                continue
            # decode() returns an Event, whose attributes are the contract's fields: read directly, not through
            # its mapping view (a Python call per key).
            t: float = msg.time  # type: ignore[attr-defined]
            if t > past_at:
                past += 1
                if past >= _PAST_RUN and stops:
                    break  # everything further on is past the window (offsets trail time by < slack)
                continue
            past = 0
            recent.append(t)
            cls = type(msg)
            kind_placement = order_of.get(cls)
            if kind_placement is None:
                kind = msg["kind"]
                kind_placement = order_of[cls] = (_KIND_ORDER.get(kind, 3), kind == "placement")
            if kind_placement[1]:
                if not self._placement(msg, t, raw):
                    continue
                telemetry -= 1  # counted below with the rest
            elif not (read_from <= t <= until):
                continue
            elif filtered and "job" in msg:
                job = msg["job"]
                seen_jobs.add(job)
                if not self._wanted_job(job, self.placement_projects.get(job)):
                    continue
            if t < released_to:
                late += 1
                if not was_late and offsets is not None:
                    if jumps is None:
                        jumps = self.jumps[stream] = []
                    if len(jumps) < _MAX_RUNS:  # as the tail's runs: past that many, the rest stay late
                        jumps.append(offsets[n - self.read - 1])
                was_late = True
            else:
                was_late = False
            key = math.floor(t)  # whole seconds: bucket bounds compare exactly with any float
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = []
                heapq.heappush(keys, key)
            bucket.append((t, kind_placement[0], topic, raw, msg))
            held += 1
            telemetry += 1
        looked = n - self.read
        self.read = n
        self.held += held
        self.telemetry += telemetry
        if late:
            self.late += late
        self._past[stream] = past
        self._was_late[stream] = was_late
        if stream in self.open:
            if past >= _PAST_RUN and stops:
                self.close(stream)
            elif recent:
                # Few messages yet: the oldest is the safe guess (it holds releases back, never lets one through
                # early); later the median of the latest, which one stray timestamp cannot move.
                mid = statistics.median_low(recent) if len(recent) >= 8 else min(recent)
                self.open[stream] = max(self.open[stream], mid)
        return looked

    def _placement(self, msg: Mapping[str, Any], t: float, raw: bytes) -> bool:
        """Note a placement's project; keep the latest before the window aside.  Whether to merge it now."""
        w = self.window
        self.placement_projects[msg["job"]] = msg["project"]
        if t > w.until:
            return False
        if w.jobs or w.projects:
            if t > w.read_from:
                self.seen_jobs.add(msg["job"])
            if not self._wanted_job(msg["job"], msg["project"]):
                return False
        if t <= w.read_from:
            old = self.before.get(msg["job"])
            if old is None or (t, raw) >= (old[0], old[1]):
                self.before[msg["job"]] = (t, raw, msg)
            return False
        return True

    def _wanted_job(self, job: str, project: str | None) -> bool:
        w = self.window
        if w.jobs and job not in w.jobs:
            return False
        if w.projects and project not in w.projects:
            return False
        return True

    def late_note(self) -> str | None:
        """What to say of :attr:`late` messages, or None: called by replay and export after reading."""
        if not self.late:
            return None
        return (f"{self.late:,} message(s) arrived more than {self.slack_s:.0f} s of event time behind what was "
                "already evaluated (history written to the topics after newer data in this window): they were "
                "evaluated late, and what they would have shown may be missing; a window around them alone "
                "(--since/--until) or --job reads them in order")

    def filter_hints(self) -> list[str]:
        """One line per ``--job``/``--project`` that matched nothing in the window, naming a few that did exist.

        Called after the replay; empty when every filter matched (or there were none).
        """
        w = self.window
        out = []
        for job in sorted(w.jobs - self.seen_jobs):
            out.append(f"--job {job}: no message of it in the window (jobs seen: {_few(self.seen_jobs)})")
        projects = {self.placement_projects[j] for j in self.seen_jobs if j in self.placement_projects}
        for project in sorted(w.projects - projects):
            out.append(f"--project {project}: no job of it in the window (projects seen: {_few(projects)})")
        return out

    def _placements_first(self) -> list[Any]:
        out = []
        for job in sorted(self.before):
            _, raw, msg = self.before.pop(job)
            out.append((TOPIC_PLACEMENT, raw) if self.raw else {**msg, "time": self.window.read_from})
        return out

    def ready(self) -> list[Any]:
        """Release every message that no open stream can still precede; return them in total order.

        Called after each :meth:`add`.  A bucket wholly before the horizon is sorted and released
        whole; the one the horizon falls in is sorted and released up to it, the rest kept (sorted,
        so sorting it again after more arrive is cheap).
        """
        if self.open and min(self.open.values()) == -float("inf"):
            return []  # a stream has not been read yet: it may hold the earliest message
        out = self._placements_first()
        horizon = min(self.open.values()) - self.slack_s if self.open else float("inf")
        buckets, keys = self._buckets, self._keys
        released: list[tuple[float, int, str, bytes, Any]] = []
        while keys and keys[0] < horizon:
            bucket = buckets[keys[0]]
            bucket.sort()
            if keys[0] + 1 <= horizon:
                released += bucket
                del buckets[heapq.heappop(keys)]
            else:  # the horizon falls inside this bucket: release what is before it
                cut = bisect_left(bucket, (horizon,))
                released += bucket[:cut]
                del bucket[:cut]
                break
        if released:
            self.held -= len(released)
            self.released_to = max(self.released_to, released[-1][0])
            out += [(item[2], item[3]) for item in released] if self.raw else [item[4] for item in released]
        return out

    def drain(self) -> list[Any]:
        """Release everything left (called once every stream is closed); return it in total order."""
        self.open.clear()
        return self.ready()


class TailScan:
    """Finds the runs of the window's events in a partition's tail: the records produced after the window.

    Called by the Kafka reader before the replay proper, with every record of the tail in offset
    order (:meth:`add`).  Live data there is stamped after the window and skipped, but history
    published later for an earlier time (``whywait import``, a simulation of the past) is the
    window's too.  A run is an offset range whose events in the window are nearly ordered (none
    more than ``slack_s`` before the latest before it); :meth:`runs` gives each as ``(first
    offset, end offset)``, for the reader to open as a stream of its own, so the merge sees
    each nearly ordered and the replay stays in one total order.  Only the times are parsed
    and only the runs' bounds are kept: memory does not grow with the tail.
    """

    def __init__(self, window: Window, slack_s: float = 30.0, placements: bool = False) -> None:
        self.lo = -float("inf") if placements else window.read_from - slack_s  # a placement before counts
        self.hi = window.until + slack_s
        self.read_from = window.read_from
        self.slack_s = slack_s
        self._runs: list[list[float]] = []  # [first offset, end offset, latest event time in the run]
        self.scanned = 0

    def add(self, offset: int, raw: bytes | None) -> None:
        """Look at the record at ``offset`` (in offset order)."""
        self.scanned += 1
        if raw is None:
            return
        try:
            t = json.loads(raw).get("time")
        except (ValueError, AttributeError, RecursionError):
            return
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not (self.lo <= t <= self.hi):
            return
        t = max(t, self.read_from)  # what precedes the window enters at its start
        runs = self._runs
        if runs and (t >= runs[-1][2] - self.slack_s or len(runs) >= _MAX_RUNS):
            run = runs[-1]
            run[1], run[2] = offset + 1, max(run[2], t)
        else:
            runs.append([offset, offset + 1, t])

    def runs(self) -> list[tuple[int, int]]:
        """The runs found so far, in offset order."""
        return [(int(a), int(b)) for a, b, _ in self._runs]


def _few(names: Iterable[str], n: int = 5) -> str:
    s = sorted(names)
    if not s:
        return "none"
    return ", ".join(s[:n]) + (f" and {len(s) - n} more" if len(s) > n else "")


def _outside(raw: bytes, w: Window) -> bool:
    """Whether a message that breaks the contract still says an event time outside the window."""
    try:
        t = json.loads(raw).get("time")
    except (ValueError, AttributeError, RecursionError):  # hostile input: malformed or nested too deeply
        return False
    return isinstance(t, (int, float)) and not isinstance(t, bool) and not (w.read_from <= t <= w.until)


def _reason(exc: ContractError) -> str:
    # Group the counts by the field at fault, not by the exact value, so the report stays short.
    return exc.path or str(exc).split(":", 1)[0][:60]


@dataclass
class ReplayResult:
    """What one rule set concluded over the replayed messages, and what was read and skipped."""

    diagnoses: list[Diagnosis]
    messages: int
    start: float | None
    end: float | None
    skipped: Counter[str] = field(default_factory=Counter)
    interrupted: bool = False
    # Incidents whose condition still held at the last tick with data: they resolve only because the clock
    # was moved on to close the windows (:func:`_close`), so they are reported as open when the data ended.
    open_at_end: frozenset[str] = frozenset()


def replay(messages: Iterable[dict[str, Any]], rules: RuleSet, topology: Any, *,
           against: tuple[RuleSet, Any] | None = None,
           on_message: Callable[[dict[str, Any]], None] | None = None) -> tuple[ReplayResult, ReplayResult | None]:
    """Feed messages (in event-time order) to a fresh evaluator; return what it concluded.

    Called once per replay.  With ``against=(old_rules, old_topology)`` a second evaluator sees
    the very same messages (a backtest in one pass) and its result is returned second.  A
    placement naming a node the topology does not hold is skipped and counted, as the live
    engine dead-letters it; Ctrl-C stops early and keeps what was concluded so far
    (``interrupted``).  ``on_message`` is called per message (progress bars).
    """
    from whywait.topology.errors import TopologyError

    evs = [Evaluator(rules, topology)] + ([Evaluator(against[0], against[1])] if against else [])
    results = [ReplayResult([], 0, None, None) for _ in evs]
    first = results[0]
    pairs = [(ev.ingest, res, partial(node_name_in, ev.topology)) for ev, res in zip(evs, results, strict=True)]
    unknown_node = ("telemetry from a node no placement read names (no topology given)"
                    if isinstance(topology, PlacedTopology) else "telemetry from a node the topology does not hold")
    # The first few names the topology lacks are counted apart, with what it holds like them (a typo, a domain).
    reason_of = None if isinstance(topology, PlacedTopology) else getattr(topology, "unknown_node_reason", None)
    unknown_keys: dict[str, str] = {}
    # Per message only what must be: the counts and the range are kept in locals and stored once at the end.
    n, lo, hi = 0, float("inf"), -float("inf")
    try:
        for m in messages:
            t = m["time"]
            n += 1
            if t < lo:
                lo = t
            if t > hi:
                hi = t
            for ingest, res, name_in in pairs:
                # Telemetry of a node the topology lacks: the live engine dead-letters it (an invented name
                # cannot grow its memory, nor count in event time), so the replay leaves it out too.  Another
                # name of one of its hosts (node01.cluster.local for node01) is that host's, as in the engine.
                if m["kind"] in NODE_KINDS and name_in(m["node"]) is None:
                    name = m["node"]
                    key = unknown_keys.get(name)
                    if key is None:
                        key = (f"{unknown_node}: {reason_of(name)}" if reason_of is not None and len(unknown_keys) < 3
                               else unknown_node)
                        if len(unknown_keys) < 1000:
                            unknown_keys[name] = key
                    res.skipped[key] += 1
                    continue
                try:
                    got = ingest(m)
                except TopologyError as exc:
                    res.skipped[f"placement skipped: {_first_line(exc)}"] += 1
                else:
                    if got:
                        res.diagnoses += got
            if on_message is not None:
                on_message(m)
    except KeyboardInterrupt:
        for res in results:
            res.interrupted = True
    if n:
        first.messages, first.start, first.end = n, lo, hi
    if first.end is not None and not first.interrupted:
        for ev, res in zip(evs, results, strict=True):
            closing, res.open_at_end = _close(ev, first.end)
            res.diagnoses += closing
    for res in results[1:]:
        res.messages, res.start, res.end = first.messages, first.start, first.end
    return first, (results[1] if against else None)


class PlacedTopology(Topology):
    """The topology a replay learns from the placements it reads, when it is given none.

    Used by ``whywait replay`` without ``--topology`` (nor ``WHYWAIT_TOPOLOGY``, nor a bundle's): the
    postmortem of a job whose step timings were imported from a profiler trace or a step table, on a
    cluster nobody described.  Each node a placement names is added with the GPUs it names, so every
    rule over a job's steps judges it; what no placement describes (NICs, switches, racks, pools) is
    absent, and the rules that join on it find nothing to join.  :attr:`learnt` lists the nodes added.
    A node is added once: a later placement naming a GPU it was not given is skipped as with any
    topology (counted), for a GPU index cannot change under a node's recorded telemetry.
    """

    def __init__(self) -> None:
        super().__init__("learnt from the placements")
        self.learnt: list[str] = []

    def apply_placement(self, msg: Mapping[str, Any]) -> Any:
        """Add the nodes ``msg`` names that are new, with its GPUs on them, then place the job."""
        if msg.get("state") != "finished":
            gpus: dict[str, set[int]] = {}
            for r in msg.get("ranks") or ():
                gpus.setdefault(str(r["node"]), set()).add(int(r["gpu"]))
            for node, idx in gpus.items():
                if self.kind_of(node) is None:
                    self.add_node(node, gpus=sorted(idx))
                    self.learnt.append(node)
        return super().apply_placement(msg)

    def note(self) -> str:
        """What the replay says of it: the nodes it learnt, and what the rules could not join without a topology."""
        return (f"no topology given: {len(self.learnt)} node(s) learnt from the placements"
                + (f" ({_few(self.learnt)})" if self.learnt else "")
                + "; rules over NICs, switches and storage pools had nothing to join (--topology FILE, "
                "or WHYWAIT_TOPOLOGY, gives them the cluster)")


def _close(ev: Evaluator, end: float) -> tuple[list[Diagnosis], frozenset[str]]:
    """Tick ``ev`` past the range's last event time ``end`` so its incidents resolve as the live engine's would.

    Called once at the end of a replay.  First the range's last seconds (held back by the lateness),
    then on, ten seconds at a time, while any incident is open and until the longest keep_firing_for
    of the rules has run out (at most :data:`_CLOSE_S`): an incident still firing then holds without
    data and stays open.  Not ticking further keeps the replay's cost where it was (ticks over windows
    that still hold the range's data are not free).  Returns the diagnoses, and the fingerprints of the
    incidents that held on the last tick with data (see :attr:`ReplayResult.open_at_end`).
    """
    out = ev.advance(end)
    last_tick = (ev.next_tick - ev.step_s) if ev.next_tick is not None else end
    held = frozenset(fp for fp, inc in ev.incidents.items() if inc.firing and inc.last_true >= last_tick - 1e-9)
    keep = max((r.keep_firing_for_s for r in ev.rules.rules.values()), default=0.0)
    until = end + min(_CLOSE_S, ev.max_gap_s, keep + 2 * ev.step_s)
    t = end
    while t < until and ev.incidents:
        t = min(until, t + 10.0)
        out += ev.advance(t)
    return out, held


def _first_line(exc: Exception) -> str:
    s = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # "unknown node 'node-01' (known: ...)" -> keep it short and stable for counting
    return s.split(" (known", 1)[0][:120]


@dataclass(frozen=True)
class Span:
    """One incident: its first firing diagnosis, its last update, and when it began and ended.

    ``last`` is the last firing update; ``updates`` are every diagnosis of the incident in order, its closing
    (resolved) one included, also for an incident still open when the data ended (its cost is the latest).
    """

    first: Diagnosis
    last: Diagnosis
    start: float
    end: float
    resolved: bool
    updates: tuple[Diagnosis, ...]

    @property
    def told(self) -> Diagnosis:
        """The update whose cause text goes with the incident's latest cost: the last one that gives a cost (the
        closing update holds the last tick's text and figures), else the first firing.

        Called where an incident is told with its cost (replay's console, the report).  Why: the first firing's
        text says the cost at detection ("has lost 0.00 GPU-hours to it so far") while the cost printed beside
        it is the latest (``cost: 3.20 GPU-hours lost``), and its culprit may be part of it (3 of a node's 8
        slow ranks, a second before the rest).
        """
        return next((u for u in reversed(self.updates) if u.cost and u.cost.get("gpu_hours_lost") is not None),
                    self.first)


def incidents(diags: list[Diagnosis], end: float | None, open_at_end: frozenset[str] = frozenset()) -> list[Span]:
    """Group diagnoses into incidents by fingerprint, in order of their start (ties by rule and culprit).

    An incident in ``open_at_end`` (:attr:`ReplayResult.open_at_end`) is open at ``end``, the last event
    time read, whatever its closing said: it still held when the data ended, which is not the same as over.
    """
    open_: dict[str, list[Diagnosis]] = {}
    spans: list[Span] = []
    for d in diags:
        if d.status == "firing":
            open_.setdefault(d.fingerprint, []).append(d)
        elif d.fingerprint in open_:
            ups = open_.pop(d.fingerprint)
            if d.fingerprint in open_at_end and end is not None:
                # Open, but its closing diagnosis stays among the updates: it carries the cost accumulated to the
                # end of the data (the first firing's is an early estimate), as --json and the digest see it.
                spans.append(Span(ups[0], ups[-1], ups[0].starts_at, max(end, ups[0].detected_at), False,
                                  (*ups, d)))
                continue
            spans.append(Span(ups[0], ups[-1], ups[0].starts_at, d.ends_at or d.detected_at, True, (*ups, d)))
    for ups in open_.values():
        f = ups[0]
        spans.append(Span(f, ups[-1], f.starts_at, max(end or f.detected_at, f.detected_at), False, tuple(ups)))
    return sorted(spans, key=lambda s: (s.start, s.first.rule_id, s.first.culprit or ""))


def diagnoses_jsonl(diags: Iterable[Diagnosis]) -> str:
    """The diagnoses as canonical JSON lines (sorted keys): what ``--json`` writes and tests compare."""
    return "".join(json.dumps(d.to_dict(), sort_keys=True, default=str) + "\n" for d in diags)


#: How far apart two firings of one incident (one in each rule set) may be detected and still be taken for the same
#: firing when their spans do not overlap: a raised threshold or a longer ``for`` fires the same episode later.
MATCH_WITHIN_S = 120.0


def _pair_firings(a: Sequence[Span], b: Sequence[Span], within_s: float) -> list[tuple[int, int]]:
    """Match the firings of one incident in the new set (``a``) with those in the old (``b``).

    Two firings may match when their spans overlap or they were detected at most ``within_s`` apart; the
    nearest pairs (by detection time) are taken first, each firing once.  The rest are firings of one set only.
    """
    cands = sorted((abs(x.first.detected_at - y.first.detected_at), i, j)
                   for i, x in enumerate(a) for j, y in enumerate(b)
                   if (x.start <= y.end and y.start <= x.end)
                   or abs(x.first.detected_at - y.first.detected_at) <= within_s)
    used_a: set[int] = set()
    used_b: set[int] = set()
    out: list[tuple[int, int]] = []
    for _, i, j in cands:
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            out.append((i, j))
    return out


def backtest(new: ReplayResult, old: ReplayResult, match_within_s: float = MATCH_WITHIN_S) -> dict[str, Any]:
    """Compare two rule sets' firings over the same events; return a JSON-ready report.

    An incident (a fingerprint: rule id and grouping labels) may fire several times, each a firing from
    fire to resolve.  The firings are compared, not the incidents: the firings of one incident in each set are
    matched by time (:func:`_pair_firings`: overlapping, or detected within ``match_within_s``, nearest first),
    and a firing left unmatched is listed as only in its set (``only_new``, ``only_old``), so a detection one set
    loses is seen however often the same incident fired.  ``timing`` lists the matched firings detected at
    another time (``seconds`` > 0 means the new set fires earlier), ``changed`` those whose title, cause or
    severity differ at first firing, ``same`` counts the rest.  Each entry gives its ``firing`` (1-based, in
    its set) and ``firings`` (how many of that incident the set has).
    """
    end = max(x for x in (new.end, old.end, 0.0) if x is not None)
    a: dict[str, list[Span]] = {}
    b: dict[str, list[Span]] = {}
    for spans, into in ((incidents(new.diagnoses, end, new.open_at_end), a),
                        (incidents(old.diagnoses, end, old.open_at_end), b)):
        for s in spans:  # in order of their start: each incident's firings come in time order
            into.setdefault(s.first.fingerprint, []).append(s)

    def brief(s: Span, firings: list[Span]) -> dict[str, Any]:
        d = s.first
        return {"fingerprint": d.fingerprint, "rule_id": d.rule_id, "job": d.job, "culprit": d.culprit,
                "severity": d.severity, "starts_at": d.starts_at, "detected_at": d.detected_at,
                "ends_at": s.end, "resolved": s.resolved, "title": d.title,
                "firing": firings.index(s) + 1, "firings": len(firings)}

    only_new: list[dict[str, Any]] = []
    only_old: list[dict[str, Any]] = []
    timing: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    same = 0
    for fp in sorted(a.keys() | b.keys()):
        xs, ys = a.get(fp, []), b.get(fp, [])
        pairs = _pair_firings(xs, ys, match_within_s)
        paired_a, paired_b = {i for i, _ in pairs}, {j for _, j in pairs}
        only_new += [brief(x, xs) for i, x in enumerate(xs) if i not in paired_a]
        only_old += [brief(y, ys) for j, y in enumerate(ys) if j not in paired_b]
        for i, j in pairs:
            na, ob = xs[i].first, ys[j].first
            moved = False
            dt = ob.detected_at - na.detected_at
            if abs(dt) > 1e-9:
                timing.append({**brief(xs[i], xs), "old_detected_at": ob.detected_at, "seconds": round(dt, 3),
                               "direction": "earlier" if dt > 0 else "later"})
                moved = True
            diffs = {f: {"old": getattr(ob, f), "new": getattr(na, f)} for f in ("severity", "title", "cause")
                     if getattr(ob, f) != getattr(na, f)}
            if diffs:
                changed.append({**brief(xs[i], xs), "changes": diffs})
                moved = True
            same += not moved

    def order(x: dict[str, Any]) -> tuple[float, str]:
        return x["starts_at"], x["fingerprint"]

    return {"only_new": sorted(only_new, key=order), "only_old": sorted(only_old, key=order),
            "timing": sorted(timing, key=order), "changed": sorted(changed, key=order), "same": same,
            "match_within_s": match_within_s}
