"""``whywait replay``: re-run the rules over recorded topics or a bundle, for a postmortem or a rule backtest.

Reads the input topics (or ``--input incident.whywait``, no broker needed) between two
event times (``--since``/``--until``: Unix seconds, ISO 8601, or relative like
``-10m``), merges them in event-time order in bounded memory (``whywait.engine.replay``),
evaluates them with the current rules (or ``--rules`` from the incident's time), and
prints the incidents.  ``--report DIR`` writes the postmortem (HTML, Markdown, PNGs);
``--against OLD`` backtests two rule sets in the same pass.  Nothing is published and
nobody is notified, except with ``--slack-thread``.

Bad ranges, missing topics and an unreachable broker are one line and exit 2; a
placement naming a node the topology lacks, or a message breaking the contract, is
skipped and counted.  Ctrl-C stops and keeps what was concluded so far.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import operator
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from whywait.engine.commands.gc_tuning import batch_gc
from whywait.engine.commands.rules_cmd import rules_path_arg
from whywait.engine.errors import BrokerUnavailable, ConfigError, RuleError
from whywait.engine.replay import TAIL_SCAN_MAX, EventTimeMerge, TailScan, Window

from whywait import jsonl
from whywait.durations import parse_duration as _parse_duration
from whywait.errors import DurationError

# How many times a window is read at most: each pass after the first reads the partitions cut where the one before
# found history written after newer data (see read_in_order).  History imported into history is a third.
MAX_PASSES = 3
_T = TypeVar("_T")

# Relative times (-10m) look like options to argparse; this lets them through as values.
_NEGATIVE = re.compile(r"^-\d+(\.\d+)?(?:ms|[smhdw])?(?:\d+(\.\d+)?(?:ms|[smhdw]))*$")


def parse_time(v: str, now: float | None = None, what: str = "time") -> float:
    """Unix seconds from ``1764442800``, ``2025-11-29T19:00:00Z``, or relative to now: ``-2h``, ``-7d``, ``+10m``.

    Called for every ``--since``/``--until`` of replay, export and digest.  A time ahead of now
    (``+10m``) is for event time that runs ahead of the clock (a simulation, a skewed agent).
    """
    return _a_time(_parse_time(v, time.time() if now is None else now, what), v, what)


def _parse_time(v: str, now: float, what: str) -> float:
    s = v.strip()
    if s[:1] in "-+" and s[1:2].isdigit() and not s[1:].replace(".", "", 1).isdigit():
        try:  # "-2h", "-1h30m", "+10m": a duration (the one syntax, whywait.durations) before or after now
            d = _parse_duration(s[1:])
            return now - d if s[0] == "-" else now + d
        except DurationError:
            pass  # not a duration: tried as a number or a date below, which names the accepted forms
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{what}: cannot read {v!r}: use Unix seconds, ISO 8601 (2026-11-29T14:00:00Z) "
                          "or a relative time (-10m, -2h, -7d, +10m)") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _a_time(t: float, v: str, what: str) -> float:
    """``t`` when it is a time a date can be written for (``1e400``, ``nan`` or year 30,000,000 is not).

    A number of milliseconds, microseconds or nanoseconds since the epoch (what many loggers print) is
    refused naming the time it would be in seconds: taken as seconds it is thousands of years ahead.
    """
    if math.isfinite(t) and t > 4e10:  # after the year 3237: no window anyone replays
        for scale, unit in ((1e3, "milliseconds"), (1e6, "microseconds"), (1e9, "nanoseconds")):
            if 946_684_800 <= t / scale < 4_102_444_800:  # 2000 to 2100 in seconds
                raise ConfigError(f"{what}: {v!r} looks like {unit} since the epoch; in seconds it is "
                                  f"{t / scale:.0f} ({_fmt(t / scale)} UTC): give Unix seconds")
    try:
        if math.isfinite(t):
            datetime.fromtimestamp(t, timezone.utc)
            return t
    except (OverflowError, ValueError, OSError):
        pass
    raise ConfigError(f"{what}: {v!r} is not a time between the years 1 and 9999: use Unix seconds, ISO 8601 "
                      "(2026-11-29T14:00:00Z) or a relative time (-10m, -2h, -7d, +10m)")


def parse_duration(v: str, what: str) -> float:
    """Seconds from ``15m``, ``90s``, ``0`` or ``2h`` (the one syntax, :mod:`whywait.durations`)."""
    try:
        return _parse_duration(v, bare_seconds=True)
    except DurationError:
        raise ConfigError(f"{what}: cannot read {v!r}: use a duration like 15m, 90s or 2h") from None


def allow_relative_times(p: argparse.ArgumentParser) -> None:
    """Let ``--since -10m`` through: argparse otherwise takes ``-10m`` for an option."""
    p._negative_number_matcher = _NEGATIVE  # type: ignore[attr-defined]


def register(p: argparse.ArgumentParser) -> None:
    allow_relative_times(p)
    src = p.add_argument_group("what to replay")
    src.add_argument("--since", help="start of the window: Unix s, ISO 8601, or relative (-10m, -2h); "
                                     "with --input: the bundle's window")
    src.add_argument("--until", help="end of the window (default: now, or the bundle's end); +10m: ahead of now")
    src.add_argument("--input", type=Path, metavar="BUNDLE", help="replay an exported incident.whywait (no broker)")
    src.add_argument("--bootstrap", help="Kafka bootstrap (default: WHYWAIT_KAFKA_BOOTSTRAP or the local broker)")
    src.add_argument("--job", action="append", default=[], help="only this job (repeatable)")
    src.add_argument("--project", action="append", default=[], help="only this project's jobs (repeatable)")
    src.add_argument("--lead", help="read this much before --since to warm baselines (default 15m; a bundle's own "
                                    "when it is replayed without --since)")
    src.add_argument("--read-to-end", action="store_true",
                     help="read every partition to its end however much was written after the window (history "
                          f"backfilled with `whywait import`); by default only when that is at most "
                          f"{TAIL_SCAN_MAX:,} records")
    how = p.add_argument_group("how")
    how.add_argument("--topology", type=Path, help="topology YAML (default: the bundle's, or WHYWAIT_TOPOLOGY)")
    how.add_argument("--rules", action="append", type=rules_path_arg,
                     help="rule files or folders (repeatable; default: the bundle's, else the engine's: ./rules or "
                          "the shipped rules, plus $WHYWAIT_SITE_RULES).  Given, they replace the default: a site "
                          "folder needs the shipped rules named too, 'shipped': --rules shipped --rules site-rules/")
    how.add_argument("--against", action="append", type=rules_path_arg, metavar="OLD",
                     help="backtest: also run these rules over the same events and compare (repeatable, like "
                          "--rules: --against shipped --against site-rules-old/; 'live': the engine's rules, "
                          "./rules or the shipped ones, plus $WHYWAIT_SITE_RULES)")
    how.add_argument("--match-within", default="2m", metavar="DURATION",
                     help="backtest: a firing in one set is the same firing as one of the same incident in the "
                          "other when they overlap or are detected at most this far apart (default 2m); the "
                          "nearest pair is matched first, and a firing left over is listed as only in its set")
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="FILE", help="write the diagnoses as JSON lines to FILE (a file: "
                                                                "'-' is refused, the summary is printed on stdout)")
    out.add_argument("--stats-json", type=Path, help="write what the replay read and cost as JSON: messages, "
                                                     "CPU-seconds and wall seconds of the replay itself, skips")
    out.add_argument("--backtest-json", type=Path, help="write the backtest comparison as JSON")
    out.add_argument("--plot", type=Path, metavar="IMAGE", help="write the main timeline (its format by the suffix: "
                                                                ".png, .svg, .pdf, ...)")
    out.add_argument("--report", type=Path, metavar="DIR", help="write the postmortem: report.html, report.md, PNGs")
    out.add_argument("--slack-thread", metavar="CHANNEL:TS",
                     help="post the summary and the main PNG into this Slack thread (e.g. C024BE91L:1764442800.0001)")
    out.add_argument("--publish-diagnoses", action="store_true",
                     help="publish the diagnoses to the diagnoses topic (labelled replayed=true), so `whywait digest` "
                          "counts history imported after the fact; nothing is notified")


# ---- sources ---------------------------------------------------------------------------------------


async def topic_partitions(bootstrap: str, topics: list[str]) -> dict[str, list[int]]:
    """Each existing topic's partition numbers, asked of the broker.

    A consumer that has subscribed to nothing knows no topic's partitions (``partitions_for_topic``
    answers None), which made a reader of a multi-partition topic read partition 0 only.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        out: dict[str, list[int]] = {}
        for t in await admin.describe_topics(topics):
            if t.get("error_code") == 0 and t.get("partitions"):
                out[t["topic"]] = sorted(p["partition"] for p in t["partitions"])
        return out
    finally:
        await admin.close()


async def topics_extent(bootstrap: str) -> tuple[float, float] | None:
    """The event times of the oldest and newest record on the input topics (placements aside), or None.

    Called when a replay's window held no telemetry, to say where the data lies: only each partition's
    first and last record are read (a record's time is its ``time`` field), so it costs a few fetches.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from whywait.agents.events import INPUT_TOPICS, TOPIC_PLACEMENT

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         request_timeout_ms=15000, auto_offset_reset="earliest")
    await asyncio.wait_for(c.start(), 20)
    try:
        names = [t for t in INPUT_TOPICS if t != TOPIC_PLACEMENT and t in await c.topics()]
        parts = await topic_partitions(bootstrap, names)
        tps = [TopicPartition(t, p) for t in names for p in parts.get(t, [0])]
        if not tps:
            return None
        c.assign(tps)
        firsts = await seek_to_log_start(c, tps)
        ends = await c.end_offsets(tps)
        times: list[float] = []
        for tp in tps:
            for off in {firsts[tp], ends[tp] - 1}:
                if off < firsts[tp] or off >= ends[tp]:
                    continue
                c.seek(tp, off)
                got = (await c.getmany(tp, timeout_ms=2000, max_records=1)).get(tp, [])
                for r in got[:1]:
                    try:
                        t = json.loads(r.value).get("time") if r.value is not None else None
                    except (ValueError, AttributeError):
                        continue
                    if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
                        times.append(float(t))
        return (min(times), max(times)) if times else None
    finally:
        await c.stop()


async def seek_to_log_start(c: Any, tps: list[Any]) -> dict[Any, int]:
    """Position each of ``tps`` (assigned to consumer ``c``) at its log start offset; return those offsets.

    Called by the replay and notifier-state readers before their first fetch.  Never
    ``seek_to_beginning``: on ``assign`` aiokafka (0.14) starts resetting every new partition in the
    background with the consumer's ``auto_offset_reset``, and ``seek_to_beginning`` only asks for
    another reset; when the background answer arrives after that request, aiokafka applies it as the
    answer to it (it checks that a reset is pending, not which one).  With the default "latest" that
    put a partition at its END, and the reader saw nothing of it: the one placement a ``whywait
    bench`` replay intermittently missed.  An explicit ``seek`` ends any pending reset, so an answer
    arriving later is dropped.
    """
    if not tps:
        return {}
    begins: dict[Any, int] = await c.beginning_offsets(tps)
    for tp in tps:
        c.seek(tp, begins[tp])
    return begins


def kafka_batches(bootstrap: str, window: Window, merge: EventTimeMerge, batch: int = 5000,
                  prefetch: int = 4, read_to_end: bool = False,
                  splits: Mapping[str, Sequence[int]] | None = None) -> Iterator[Any]:
    """Yield the window's messages from Kafka in event-time order (through ``merge``), a partition at a time.

    The aiokafka consumer and the merge (which decodes) run on a reader thread with its own event
    loop, at most ``prefetch`` released batches ahead of the caller: fetching overlaps with the
    evaluator instead of waiting a broker round trip per batch, and memory stays bounded (a few
    batches plus the merge's slack).  The reader's errors are raised here; closing this generator
    (Ctrl-C, an error in the caller) stops the reader and its consumer.

    Each partition is read up to its end offset as it was when the replay began.  Records produced
    after the window (its tail) are scanned for the window's events (a backfill) when there are at
    most ``TAIL_SCAN_MAX`` of them, or with ``read_to_end``; a longer tail is not read past the run
    of messages after the window, and ``merge.stopped_early`` says where each partition stopped.

    ``splits`` (partition name, as ``topic[p]``, to offsets) cuts a partition there into streams of
    their own: where an earlier pass found history written after newer data (``merge.jumps``, see
    :func:`read_in_order`).
    """
    import queue
    import threading

    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=prefetch)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    async def read() -> None:
        agen = _kafka_agen(bootstrap, window, merge, batch, read_to_end, splits or {})
        try:
            async for msgs in agen:
                if msgs and not put(("batch", msgs)):
                    return
        finally:
            await agen.aclose()

    def reader() -> None:
        try:
            asyncio.run(read())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            put(("error", exc))
        else:
            put(("end", None))

    th = threading.Thread(target=reader, name="whywait-replay-reader", daemon=True)
    th.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "batch":
                yield from item
            elif kind == "error":
                raise item
            else:
                return
    finally:
        stop.set()
        th.join(30)


@dataclass
class _Span:
    """One stream of the merge on the broker: a partition's records from ``pos`` to ``end`` (exclusive)."""

    tp: Any
    pos: int
    end: int
    log_end: int  # the partition's end offset when the replay began


async def _kafka_agen(bootstrap: str, window: Window, merge: EventTimeMerge, batch: int,
                      read_to_end: bool = False,
                      splits: Mapping[str, Sequence[int]] | None = None) -> AsyncGenerator[list[Any], None]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError
    from whywait.agents.events import INPUT_TOPICS, TOPIC_PLACEMENT
    from whywait.engine.localkafka.broker import probe

    if not probe(bootstrap, timeout=3.0):
        raise BrokerUnavailable(bootstrap, "nothing answers there")
    # Every partition is positioned explicitly below (seek_to_log_start, seek); "earliest" only decides where a
    # position that falls out of range while reading (retention deleting under the reader) goes on: to the oldest
    # record still there, never silently to the end.
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         request_timeout_ms=15000, auto_offset_reset="earliest")
    try:
        await asyncio.wait_for(c.start(), 20)
        topics = await c.topics()
    except (KafkaError, OSError, asyncio.TimeoutError) as exc:
        await c.stop()
        raise BrokerUnavailable(bootstrap, type(exc).__name__) from None
    try:
        # The topics that exist are read: `whywait simulate` creates only those it writes, and a cluster without
        # some agent never gets its topic.  None at all is a wrong broker.
        present = [t for t in INPUT_TOPICS if t in topics]
        missing = [t for t in INPUT_TOPICS if t not in topics]
        if not present:
            raise ConfigError(f"none of the input topics ({', '.join(INPUT_TOPICS)}) is on {bootstrap}: is this "
                              "the cluster the agents publish to? (`whywait engine` creates them)")
        if missing:
            merge.notes.append(f"topic(s) {', '.join(missing)} not on {bootstrap}: nothing read from them")
        parts = await topic_partitions(bootstrap, present)
        tps = [TopicPartition(t, p) for t in present for p in parts.get(t, [0])]
        c.assign(tps)
        ends = await c.end_offsets(tps)  # what is read: the records there when the replay began
        # Producer timestamps trail event time by little on live clusters; seek a margin earlier.
        starts = await c.offsets_for_times({tp: max(0, int((window.read_from - 600) * 1000)) for tp in tps})
        # The first record produced after the window (and a margin): live data from there on is past it, but
        # history published later for the window's time (a backfill) is there too.
        after = await c.offsets_for_times({tp: int((window.until + merge.slack_s + 600) * 1000) for tp in tps})
        # Placements are compacted (a job's may be far older than the window).  No record stamped after the
        # window's start means producer time and event time disagree (a backfill, a skewed clock): such
        # partitions are read from their start and filtered by event time.
        whole = [tp for tp in tps if tp.topic == TOPIC_PLACEMENT or starts.get(tp) is None]
        pos: dict[Any, int] = await seek_to_log_start(c, whole)
        for tp in tps:
            if tp not in pos:
                pos[tp] = starts[tp].offset
        spans: dict[str, _Span] = {}
        for tp in tps:
            name, lo, end = f"{tp.topic}[{tp.partition}]", pos[tp], ends[tp]
            hit = after.get(tp)
            tail_at = min(end, max(lo, hit.offset if hit is not None else end))
            if tail_at < end and (read_to_end or end - tail_at <= TAIL_SCAN_MAX):
                # Read up to the tail, then only the tail's runs of the window's events, each a stream.
                spans[name] = _Span(tp, lo, tail_at, end)
                merge.to_end.add(name)
                for a, b in await _scan_tail(c, tp, tail_at, end, window, merge, batch):
                    spans[f"{name}@{a}"] = _Span(tp, a, b, end)
                    merge.to_end.add(f"{name}@{a}")
            else:
                # Nothing after the window, or too much to scan: up to the end, or until the stream's run of
                # messages past the window (the replay says where it stopped).
                spans[name] = _Span(tp, lo, end, end)
                if tail_at >= end:
                    merge.to_end.add(name)
            for x in sorted(set((splits or {}).get(name, ()))):
                _split_span(spans, merge, name, x)
        merge.open = dict.fromkeys(spans, -float("inf"))
        for name, sp in spans.items():
            if sp.pos >= sp.end:
                merge.close(name)
        at: dict[Any, int] = {}  # where the consumer stands in each partition
        empty = Counter[str]()
        stopped: list[dict[str, Any]] = []
        while (sid := merge.want()) is not None:
            sp = spans[sid]
            tp = sp.tp
            if at.get(tp) != sp.pos:
                c.seek(tp, sp.pos)
            got = (await c.getmany(tp, timeout_ms=2000, max_records=batch)).get(tp, [])
            if not got:
                at.pop(tp, None)
                empty[sid] += 1
                if empty[sid] >= 5:  # the partition's end is listed but nothing comes: do not hang
                    merge.skipped[f"{sid}: stopped reading, no records for 10 s before its end offset"] += 1
                    merge.close(sid)
                continue
            at[tp] = got[-1].offset + 1
            recs = [r for r in got if r.offset < sp.end]
            sp.pos = recs[-1].offset + 1 if recs else sp.end
            if recs:
                looked = merge.add(sid, tp.topic, [r.value for r in recs], [r.offset for r in recs])
                if sid not in merge.open:  # closed early: the rest is past the window, as far as the merge knows
                    sp.pos = recs[looked].offset if looked < len(recs) else sp.pos
                    if sp.pos < sp.log_end:
                        stopped.append({"partition": sid, "offset": sp.pos, "end": sp.log_end})
            if sp.pos >= sp.end:
                merge.close(sid)
            yield list(merge.ready())
        if stopped:
            merge.stopped_early = stopped
            merge.skipped[f"not read: the records after the window's on {len(stopped)} partition(s) (--read-to-end "
                          "reads them)"] += sum(s["end"] - s["offset"] for s in stopped)
        yield list(merge.drain())
    except KafkaError as exc:
        raise BrokerUnavailable(bootstrap, f"{type(exc).__name__} while reading") from None
    finally:
        await c.stop()


def _split_span(spans: dict[str, _Span], merge: EventTimeMerge, name: str, x: int) -> None:
    """Cut the stream of partition ``name`` that holds offset ``x`` in two there, each read to its end.

    The first part is read to ``x`` whatever it holds (it must not stop early: the records after it are
    another stream's); the second keeps what the whole was (read to its end, or stopping after the window).
    """
    for sid, sp in list(spans.items()):
        if (sid == name or sid.startswith((f"{name}@", f"{name}#"))) and sp.pos < x < sp.end:
            part = f"{name}#{x}"
            spans[part] = _Span(sp.tp, x, sp.end, sp.log_end)
            if sid in merge.to_end:
                merge.to_end.add(part)
            sp.end = x
            merge.to_end.add(sid)
            return


def partition_of(stream: str) -> str:
    """The partition (``topic[p]``) a merge stream of the Kafka reader reads: its name without ``@``/``#`` parts."""
    return stream.split("@", 1)[0].split("#", 1)[0]


async def _scan_tail(c: Any, tp: Any, pos: int, end: int, window: Window, merge: EventTimeMerge,
                     batch: int) -> list[tuple[int, int]]:
    """The runs of the window's events among ``tp``'s records ``pos`` to ``end`` (see ``TailScan``)."""
    from whywait.agents.events import TOPIC_PLACEMENT

    scan = TailScan(window, merge.slack_s, placements=tp.topic == TOPIC_PLACEMENT)
    c.seek(tp, pos)
    empty = 0
    while pos < end:
        got = (await c.getmany(tp, timeout_ms=2000, max_records=batch)).get(tp, [])
        if not got:
            empty += 1
            if empty >= 5:  # as the reader: an end offset listed but nothing coming must not hang the replay
                break
            continue
        for r in got:
            if r.offset < end:
                scan.add(r.offset, r.value)
        pos = got[-1].offset + 1
    return scan.runs()


def read_in_order(messages: Callable[[EventTimeMerge, Mapping[str, Sequence[int]]], Iterable[Any]], w: Window,
                  consume: Callable[[Iterable[Any]], _T], *, raw: bool = False,
                  again: Callable[[_T], bool] = lambda _: True,
                  who: str = "whywait replay") -> tuple[_T, EventTimeMerge, dict[str, list[int]]]:
    """Read the window with ``consume`` in event-time order, again if history was found written after newer data.

    Called by replay, its report and export.  A partition that holds, in offset order, newer data and
    then history for an earlier time of the window (``whywait import`` of the last hour, an agent
    sending its backlog after an outage) cannot be merged in order in one pass: what came first was
    evaluated before the history was seen.  Such a pass's merge knows where each late run began
    (``merge.jumps``); the window is then read again with the partitions cut there, each run a stream
    of its own, so the merge puts every message in its place.  Nothing is held for this: the normal
    case costs one pass, and the history case one more (at most :data:`MAX_PASSES`; what is still
    late then is said, as before).  ``again(result)`` says whether a pass may be redone (not after
    Ctrl-C).  Returns the last pass's result, its merge and the cuts made.
    """
    splits: dict[str, list[int]] = {}
    n = 0
    while True:
        n += 1
        merge = EventTimeMerge([], w)
        merge.raw = raw
        out = consume(messages(merge, splits))
        found: dict[str, list[int]] = {}
        for stream, offsets in merge.jumps.items():
            part = partition_of(stream)
            new = [x for x in offsets if x not in splits.get(part, ())]
            if new:
                found.setdefault(part, []).extend(new)
        if not found or n >= MAX_PASSES or not again(out):
            if n > 1:
                merge.notes.append(f"the window was read {n} times: {sum(map(len, splits.values())):,} run(s) of "
                                   f"history on {len(splits)} partition(s) were written after newer data, and each "
                                   "was then read as a stream of its own, in event-time order")
            return out, merge, splits
        print(f"{who}: {merge.late:,} message(s) on {len(found)} partition(s) were written after newer data "
              "(history imported late, an agent's backlog): reading the window again with each such run as a "
              "stream of its own, so they are evaluated in event-time order", file=sys.stderr)
        for part, xs in found.items():
            splits.setdefault(part, []).extend(xs)


def bundle_batches(bundle: Any, merge: EventTimeMerge, batch: int = 5000) -> Iterator[dict[str, Any]]:
    """Yield a bundle's messages in the window, in the same event-time order a Kafka replay uses.

    The lines the bundle skipped (:attr:`Bundle.skipped`) are counted in ``merge.skipped`` as they are read, so
    the replay's report counts them with its own skips.
    """
    merge.open = {"bundle": -float("inf")}
    by_topic: dict[str, list[bytes]] = {}
    counted: Counter[str] = Counter(bundle.skipped)  # skipped by an earlier read of the same bundle

    def count_skipped() -> None:
        new = bundle.skipped - counted
        merge.skipped.update(new)
        counted.update(new)

    n = 0
    for topic, raw in bundle.events():
        values = by_topic.get(topic)
        if values is None:
            values = by_topic[topic] = []
        values.append(raw)
        n += 1
        if n >= batch:
            count_skipped()
            yield from _add_by_topic(merge, by_topic)
            n = 0
    count_skipped()
    yield from _add_by_topic(merge, by_topic)
    yield from merge.drain()


def _add_by_topic(merge: EventTimeMerge, by_topic: dict[str, list[bytes]]) -> list[Any]:
    """Hand one batch of a bundle's records to ``merge``, topic by topic; return what it releases."""
    for t in sorted(by_topic):
        merge.add("bundle", t, by_topic[t])
    by_topic.clear()
    return merge.ready()


# ---- the command -----------------------------------------------------------------------------------


class Plan:
    """Everything ``run`` resolved from the flags: window, source, rules, topology paths."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        import os

        from whywait.engine.commands.engine_cmd import default_rule_paths

        now = time.time()
        self.bundle = None
        bwin: dict[str, Any] = {}
        topo_path = args.topology
        rules_paths = args.rules
        if args.input is not None:
            from whywait.engine.importers.bundle import Bundle

            self.bundle = Bundle(args.input)
            self.bundle.verify()
            bwin = self.bundle.manifest.get("window") or {}
            btopo, brules = self.bundle.extract(tmp)
            topo_path = topo_path or btopo
            rules_paths = rules_paths or brules or None
        if args.since is None and "since" not in bwin:
            raise ConfigError("--since is required (or --input BUNDLE)")
        since = parse_time(args.since, now, "--since") if args.since else float(bwin["since"])
        until = parse_time(args.until, now, "--until") if args.until else float(bwin.get("until", now))
        # A --lead given is read (and refused when wrong) even where a bundle's own would serve; it was ignored.
        lead = (parse_duration(args.lead or "15m", "--lead") if args.since or args.lead or "lead_s" not in bwin
                else float(bwin["lead_s"]))
        if until <= since:
            if self.bundle is not None and not (args.since and args.until):
                # one of the two ends is the bundle's: say what the bundle holds, not a flag the user never gave
                held = f"{_fmt(float(bwin.get('since', since)))} to {_fmt(float(bwin.get('until', until)))} UTC"
                raise ConfigError(f"{'--since' if args.since else '--until'} {_fmt(since if args.since else until)} "
                                  f"is outside {args.input}, which holds {held}")
            raise ConfigError(f"--until ({_fmt(until)}) must be after --since ({_fmt(since)})")
        self.window = Window(since, until, lead, frozenset(args.job), frozenset(args.project))
        # Without --rules, and for --against live: the rules the live engine loads, $WHYWAIT_SITE_RULES
        # included (it was ./rules only, so a site's own rules were missing from its replays and backtests).
        self.rules_paths: list[Path] = rules_paths or default_rule_paths()
        self.topo_path: Path | None = topo_path or (Path(os.environ["WHYWAIT_TOPOLOGY"])
                                                    if os.environ.get("WHYWAIT_TOPOLOGY") else None)
        self.against: list[Path] | None = None
        if args.against:
            self.against = [p for a in args.against for p in (default_rule_paths() if str(a) == "live" else [a])]
        self.bootstrap = args.bootstrap
        self.read_to_end = bool(getattr(args, "read_to_end", False))

    def messages(self, merge: EventTimeMerge,
                 splits: Mapping[str, Sequence[int]] | None = None) -> Iterator[dict[str, Any]]:
        """A fresh pass over the window's messages (the report reads them twice); ``splits``: see kafka_batches."""
        if self.bundle is not None:
            return bundle_batches(self.bundle, merge)
        from whywait.engine.localkafka.broker import resolve_bootstrap

        return kafka_batches(resolve_bootstrap(flag=self.bootstrap), self.window, merge,
                             read_to_end=self.read_to_end, splits=splits)


async def notify_records(bootstrap: str) -> list[dict[str, Any]]:
    """Every incident record the live Slack notifier kept (its state topic), for links to its threads.

    Best effort: a postmortem does not fail for want of links, so a missing topic gives none.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError
    from whywait.engine.notify.state import STATE_TOPIC

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    out: list[dict[str, Any]] = []
    try:
        await asyncio.wait_for(c.start(), 20)
        parts = (await topic_partitions(bootstrap, [STATE_TOPIC])).get(STATE_TOPIC, [])
        tps = [TopicPartition(STATE_TOPIC, p) for p in parts]
        if not tps:
            return out
        c.assign(tps)
        begins = await seek_to_log_start(c, tps)
        ends = await c.end_offsets(tps)
        pending = {tp for tp in tps if ends[tp] > begins[tp]}
        while pending:
            batch = await c.getmany(*pending, timeout_ms=2000)
            if not batch:
                break
            for tp, recs in batch.items():
                for r in recs:
                    if r.value is not None:  # records later tombstoned still tell where the thread was
                        try:
                            out.append(jsonl.loads(r.value))
                        except ValueError:
                            pass
                if await c.position(tp) >= ends[tp]:
                    pending.discard(tp)
    except (KafkaError, OSError, asyncio.TimeoutError):
        return out
    finally:
        await c.stop()
    return out


async def publish_diagnoses(bootstrap: str, diags: list[Any]) -> int:
    """Send ``diags`` to the diagnoses topic as the engine does (keyed by fingerprint), labelled ``replayed``.

    Called by ``replay --publish-diagnoses``: the digest reads the diagnoses topic, so history imported after the
    fact (a step table, traces) counted no loss.  Nothing consumes that topic to notify, so no message is sent to
    anyone; a fingerprint the live engine published too is one incident to the digest (its last record wins).
    """
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError
    from whywait.agents.events import TOPIC_DIAGNOSES
    from whywait.engine.localkafka.broker import probe
    from whywait.engine.stream.app import diagnosis_value
    from whywait.engine.stream.topics import ensure_topics_async

    if not probe(bootstrap, timeout=3.0):
        raise BrokerUnavailable(bootstrap, "nothing answers there")
    await ensure_topics_async(bootstrap, [TOPIC_DIAGNOSES])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    try:
        await producer.start()
        for d in diags:
            d = dataclasses.replace(d, labels={**d.labels, "replayed": "true"})
            await producer.send(TOPIC_DIAGNOSES, diagnosis_value(d), key=d.fingerprint.encode())
        await producer.flush()
    except KafkaError as exc:
        raise BrokerUnavailable(bootstrap, type(exc).__name__) from None
    finally:
        await producer.stop()
    return len(diags)


def run(args: argparse.Namespace) -> int:
    import os
    import tempfile

    from whywait.engine.commands.engine_cmd import load_topology
    from whywait.engine.commands.outputs import check_outputs
    from whywait.engine.replay import PlacedTopology, ReplayResult, backtest, diagnoses_jsonl, incidents, replay
    from whywait.engine.rules.loader import load_rules

    if args.slack_thread:  # refused now, not after the whole window was replayed
        check_slack_thread(args.slack_thread)
    match_within = parse_duration(getattr(args, "match_within", "2m"), "--match-within")
    import logging

    # A window with hours between its data (an imported table, then today's telemetry) skips the gap: the live
    # engine warns of that, a replay expects it.  The evaluator's errors (a rule that raised) still show.
    logging.getLogger("whywait.engine.evaluate.evaluator").setLevel(logging.ERROR)
    check_outputs([(args.json, "--json"), (args.stats_json, "--stats-json"), (args.backtest_json, "--backtest-json")],
                  [(args.report, "--report")], [(args.plot, "--plot")])
    with tempfile.TemporaryDirectory(prefix="whywait-replay-") as tmpd:
        plan = Plan(args, Path(tmpd))
        w = plan.window
        try:
            rules = load_rules(plan.rules_paths)
        except RuleError as err:
            if plan.bundle is None:
                raise
            # the bundle's rules were extracted under tmpd, which is gone once this ends: name the members
            raise RuleError(plan.bundle.shown(str(err), Path(tmpd))) from None
        def topo() -> Any:  # one per pass: the report's second pass learns the placements again
            return load_topology(plan.topo_path) if plan.topo_path is not None else PlacedTopology()

        old_rules = load_rules(plan.against) if plan.against else None
        topology = topo()  # a broken topology is refused before any reading; the first pass uses it
        unused = [topology]

        steps_of: Counter[tuple[str, int]] = Counter()  # (job, rank) -> steps read: what a quiet window says
        world: dict[str, int] = {}  # job -> ranks its latest placement names

        def one_pass(msgs: Iterable[Any]) -> tuple[ReplayResult, ReplayResult | None]:
            nonlocal topology
            topology = unused.pop() if unused else topo()  # a pass again learns the placements afresh
            steps_of.clear()
            world.clear()
            with batch_gc(), progress_bar(w) as tick:
                def seen(m: Mapping[str, Any]) -> None:
                    kind = m["kind"]
                    if kind == "steps" and m["time"] >= w.since:
                        job = m["job"]
                        for st in m.get("steps") or ():
                            steps_of[(job, st["rank"])] += 1
                    elif kind == "placement" and m.get("state") == "running":
                        world[m["job"]] = len(m.get("ranks") or ())
                    if tick is not None:
                        tick(m)

                return replay(msgs, rules, topology, against=(old_rules, topo()) if old_rules else None,
                              on_message=seen)

        t_wall, t_cpu = time.monotonic(), time.process_time()
        (res, old), merge, splits = read_in_order(plan.messages, w, one_pass, again=lambda r: not r[0].interrupted)
        wall, cpu = time.monotonic() - t_wall, time.process_time() - t_cpu
        res.skipped.update(merge.skipped)
        spans = incidents(res.diagnoses, res.end, res.open_at_end)
        shown = [s for s in spans if s.end >= w.since]
        what = f"{args.input}" if args.input else "the topics"
        print(f"replayed {res.messages} messages of {what} from {_fmt(w.since)} to {_fmt(w.until)} UTC "
              f"({res.messages / wall if wall > 0 else 0:,.0f} msg/s): {len(shown)} incident(s)"
              + (" -- interrupted (Ctrl-C), showing what was done" if res.interrupted else ""))
        for s in shown:
            d = s.first
            state = "resolved" if s.resolved else "still open when the data ended"
            now = s.told  # as last told: the text that goes with the cost below, and the whole culprit
            print(f"  {_fmt(s.start)} → {_fmt(s.end)}  {d.severity:8} {d.rule_id}  {now.culprit or d.job}: "
                  f"{now.title} [{state}]")
            print(f"      {now.cause}")
            cost = latest_cost(s)
            if cost is not None:
                print(f"      cost: {cost:.2f} GPU-hours lost")
        for why, n in sorted(res.skipped.items()):
            print(f"  skipped {n}: {why}")
        notes = merge.notes + ([] if res.interrupted else merge.filter_hints())
        late = merge.late_note()
        if late:
            notes.append(late)
        if not merge.telemetry and not res.interrupted:
            notes.append(_where_the_data_is(plan))
        if isinstance(topology, PlacedTopology):
            notes.append(topology.note())
        per_job: dict[str, list[int]] = {}
        for (job, _), count in steps_of.items():
            per_job.setdefault(job, []).append(count)
        unplaced = sorted(j for j in per_job if j not in world)
        if unplaced:
            # The evaluator judges a job's steps against its placement (its ranks, nodes and owner): without one
            # they are read and never judged, and the window looked quiet.
            notes.append(f"steps of {', '.join(unplaced[:5])}{' …' if len(unplaced) > 5 else ''} came with no "
                         "placement naming the job, so they were not judged (`whywait import --project P --team T` "
                         "publishes one with the steps; a live job gets it from the Slurm or Kubernetes hook)")
        if not shown and not res.interrupted:  # a quiet window: say where it says little (the report does too)
            from whywait.engine.report.render import too_little

            notes += [note for job in sorted(per_job) if job in world
                      and (note := too_little(job, per_job[job], world[job], False))]
        for note in notes:
            print(f"  note: {note}")
        if merge.stopped_early:
            first, more = merge.stopped_early[0], len(merge.stopped_early) - 1
            print(f"whywait replay: stopped reading {first['partition']} at offset {first['offset']} of "
                  f"{first['end']}" + (f" (and {more} more partition(s))" if more else "")
                  + ": records after it are stamped after the window; --read-to-end reads them all (history "
                  "backfilled with `whywait import`)", file=sys.stderr)
        if args.json:
            args.json.write_text(diagnoses_jsonl(res.diagnoses))
        if getattr(args, "publish_diagnoses", False):
            from whywait.engine.localkafka.broker import resolve_bootstrap

            where = resolve_bootstrap(flag=plan.bootstrap)
            n = asyncio.run(publish_diagnoses(where, res.diagnoses))
            print(f"published {n} diagnosis message(s) of {len(shown)} incident(s) to the diagnoses topic on {where}")
        if args.stats_json:  # `whywait bench` reads it: the replay's own cost, start-up (rules, topology) excluded
            args.stats_json.write_text(json.dumps({
                "messages": res.messages, "cpu_s": cpu, "wall_s": wall, "incidents": len(shown),
                "read": merge.read, "skipped": dict(sorted(res.skipped.items())),
                "notes": notes, "stopped_early": merge.stopped_early,
                "interrupted": res.interrupted}, indent=2) + "\n")
        if old is not None:
            cmp = backtest(res, old, match_within)
            print_backtest(cmp)
            if args.backtest_json:
                args.backtest_json.write_text(json.dumps(cmp, indent=2, sort_keys=True) + "\n")
        if args.plot or args.report or args.slack_thread:
            from whywait.engine.report import build_report, slack_threads

            threads: dict[str, str] = {}
            if plan.bundle is None and args.report:
                from whywait.engine.localkafka.broker import resolve_bootstrap

                records = asyncio.run(notify_records(resolve_bootstrap(flag=plan.bootstrap)))
                threads = slack_threads(records, os.environ.get("WHYWAIT_SLACK_WORKSPACE_URL") or "https://slack.com")
            with batch_gc():  # the cuts the replay made, so the report sees the same order
                rep = build_report(res, spans, plan.messages(EventTimeMerge([], w), splits), w, topo(), threads)
            if args.plot:
                from whywait.engine.report.plots import PAGE_INCIDENTS

                rep.timeline_png(args.plot)
                n_inc = len(rep.data.incidents)
                paged = f" (incidents #1–#{PAGE_INCIDENTS} of {n_inc}; --report draws every one)" \
                    if n_inc > PAGE_INCIDENTS else ""
                print(f"timeline: {args.plot}{paged}")
            if args.report:
                paths = rep.write(args.report, keep=(args.plot,) if args.plot else ())
                print(f"report: {paths['html']} (and {paths['md'].name}, {len(paths['pngs'])} PNG)")
            if args.slack_thread:
                from whywait.engine.report.slack import post_to_thread

                post_to_thread(rep, args.slack_thread, Path(tmpd))
                print(f"posted the summary and timeline to {args.slack_thread}")
    return 130 if res.interrupted else 0


def _where_the_data_is(plan: Plan) -> str:
    """What to say when the window held no telemetry: where the data is (a wrong window is the usual cause)."""
    w = plan.window
    if plan.bundle is not None:
        held = plan.bundle.manifest.get("window") or {}
        if "since" in held and "until" in held:
            return (f"no telemetry in the window; {plan.bundle.path} holds {_fmt(float(held['since']))} to "
                    f"{_fmt(float(held['until']))} UTC")
        return "no telemetry in the window"
    from whywait.engine.localkafka.broker import resolve_bootstrap

    try:
        extent = asyncio.run(topics_extent(resolve_bootstrap(flag=plan.bootstrap)))
    except Exception as exc:  # noqa: BLE001 - a hint only: the replay's own result stands
        return f"no telemetry in the window (where the topics' data lies could not be read: {type(exc).__name__})"
    if extent is None:
        return "no telemetry in the window, and the input topics hold none at all"
    lo, hi = extent
    where = "before" if hi < w.read_from else "after" if lo > w.until else "around"
    return (f"no telemetry in the window ({_fmt(w.read_from)} to {_fmt(w.until)} UTC); the input topics hold "
            f"records from {_fmt(lo)} to {_fmt(hi)} UTC (each partition's first and last), {where} it: is the "
            "window right? (--since/--until take UTC, e.g. 2026-11-29T14:00:00Z)")


def latest_cost(s: Any) -> float | None:
    """GPU-hours an incident (a ``Span``) lost: its latest update's that gives one, the resolution's if any.

    The first diagnosis's is the early estimate; the report shows this one too.
    """
    cost = s.told.cost
    return None if not cost or cost.get("gpu_hours_lost") is None else float(cost["gpu_hours_lost"])


def check_slack_thread(target: str) -> None:
    """Refuse ``--slack-thread`` before any work: a malformed target or no token is one line, exit 2."""
    from whywait.engine.notify.secrets import read_secret
    from whywait.engine.report.slack import parse_thread

    parse_thread(target)
    if read_secret("SLACK_BOT_TOKEN") is None:
        raise ConfigError("--slack-thread needs SLACK_BOT_TOKEN (or SLACK_BOT_TOKEN_FILE)")


def plot_window(bootstrap: str, topology: Path, rules: list[Path], since: float, until: float, out: Path) -> Path:
    """Replay ``[since, until]`` from Kafka and draw its timeline PNG (``whywait demo`` calls this)."""
    from whywait.engine.commands.engine_cmd import load_topology
    from whywait.engine.replay import incidents, replay
    from whywait.engine.report import build_report
    from whywait.engine.rules.loader import load_rules

    w = Window(since, until)
    ruleset = load_rules(rules)
    (res, _), _, splits = read_in_order(lambda merge, cut: kafka_batches(bootstrap, w, merge, splits=cut), w,
                                        lambda msgs: replay(msgs, ruleset, load_topology(topology)), who="whywait demo")
    spans = incidents(res.diagnoses, res.end, res.open_at_end)
    rep = build_report(res, spans, kafka_batches(bootstrap, w, EventTimeMerge([], w), splits=splits), w,
                       load_topology(topology))
    return rep.timeline_png(out)


def print_backtest(cmp: dict[str, Any]) -> None:
    """Print the backtest comparison as lines a reviewer can read."""
    print(f"backtest: {len(cmp['only_new'])} only in the new rules, {len(cmp['only_old'])} only in the old, "
          f"{len(cmp['timing'])} fire at another time, {len(cmp['changed'])} changed, {cmp['same']} the same")
    for d in cmp["only_new"]:
        print(f"  + {_fmt(d['detected_at'])}  {d['rule_id']}  {d['culprit'] or d['job']}: {d['title']}{_nth(d)}")
    for d in cmp["only_old"]:
        print(f"  - {_fmt(d['detected_at'])}  {d['rule_id']}  {d['culprit'] or d['job']}: {d['title']}{_nth(d)}")
    for d in cmp["timing"]:
        print(f"  ~ {d['rule_id']}  {d['culprit'] or d['job']}: fires {abs(d['seconds']):g} s {d['direction']} "
              f"({_fmt(d['detected_at'])} vs {_fmt(d['old_detected_at'])}){_nth(d)}")
    for d in cmp["changed"]:
        for f, ch in d["changes"].items():
            print(f"  * {d['rule_id']}  {d['culprit'] or d['job']}: {f} {ch['old']!r} -> {ch['new']!r}")


def _nth(d: dict[str, Any]) -> str:
    """`` (firing 1 of 2)`` for an incident its set fired more than once, else nothing."""
    return f" (firing {d['firing']} of {d['firings']})" if d.get("firings", 1) > 1 else ""


class progress_bar:  # noqa: N801 - used as a context manager like a function
    """A rich progress bar over event time (events/s, time left), shown only when stderr is a terminal.

    Entering gives the function to call per replayed message, or None when there is no terminal.
    ``label`` leads the line; ``time_of`` gives a message's event time (``whywait export`` passes the
    merge's watermark, as its messages are raw bytes).
    """

    def __init__(self, w: Window, label: str = "replaying",
                 time_of: Callable[[Any], float] = operator.itemgetter("time")) -> None:
        self.w, self.label, self.time_of = w, label, time_of
        self.bar: Any = None

    def __enter__(self) -> Callable[[Any], None] | None:
        if not sys.stderr.isatty():
            return None  # nothing to call per message
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn(self.label), BarColumn(), TextColumn("{task.fields[rate]} events/s"),
                            TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True)
        self.bar.start()
        total = self.w.until - self.w.read_from
        task = self.bar.add_task("replay", total=total, rate="0")
        state = {"n": 0, "t0": time.monotonic(), "last": 0.0}

        time_of = self.time_of

        def tick(m: Any) -> None:
            state["n"] += 1
            now = time.monotonic()
            if now - state["last"] > 0.2:  # redraw five times a second, not per message
                state["last"] = now
                rate = state["n"] / max(now - state["t0"], 1e-9)
                self.bar.update(task, completed=min(total, time_of(m) - self.w.read_from), rate=f"{rate:,.0f}")

        return tick

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _fmt(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
