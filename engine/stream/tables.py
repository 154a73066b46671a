"""What a partitioned engine worker reads outside its consumer group (aiokafka).

Called by the partitioned faust app (``engine/stream/app.py``):

- :class:`PlacementTable` follows the compacted placement topic *whole* on every worker (a global
  table, never split by the group): the router needs every job's placement to route a node's
  telemetry, and the evaluator needs it to know its jobs' ranks.
- :func:`read_job_states` reads the per-job incident checkpoints (``whywait.engine-state.v1``, key
  ``GROUP|job|JOB``) of the jobs a worker has just gained, so it continues their incidents.
- :func:`read_window` re-reads the bounded window of event time before the group's committed
  offset of each gained partition of the repartition topic, so the new owner's metric store holds
  the last ``window_s`` of its new jobs before it evaluates them (records there carry their event
  time as timestamp, so offsets-for-times finds the window's start).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Mapping

from whywait.agents.events import TOPIC_PLACEMENT, ContractError, decode
from whywait.engine.stream.topics import TOPIC_ENGINE_STATE

from whywait import jsonl

log = logging.getLogger(__name__)


async def partitions_of(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (1 when it does not exist yet).

    Asked of the admin client: a consumer without a subscription does not know a topic's partitions
    (``partitions_for_topic`` is None until it has fetched that topic's metadata).
    """
    from whywait.engine.stream.topics import topic_partitions_async

    return (await topic_partitions_async(bootstrap, [topic])).get(topic, 1)


def job_state_key(group: str, job: str) -> bytes:
    """The compacted key of one job's incident checkpoint for consumer group ``group``."""
    return f"{group}|job|{job}".encode()


class PlacementTable:
    """Follows every partition of the placement topic from its beginning and applies each placement.

    ``apply(msg)`` is called on the event loop with every valid placement (invalid ones are
    dead-lettered by the router, which reads the same topic through the consumer group).
    :attr:`caught_up` is False until the table has read up to the end offsets it found at start,
    and whenever new placements are unread: the evaluator's watermark waits for it.
    """

    def __init__(self, bootstrap: str, apply: Callable[[Mapping[str, Any]], None], *,
                 topic: str = TOPIC_PLACEMENT, not_before: float | None = None) -> None:
        self.bootstrap = bootstrap
        self.apply = apply
        self.topic = topic
        self.not_before = not_before
        self.caught_up = False
        self.applied = 0
        self._consumer: Any = None  # the following consumer, while it runs
        self._ends_client: Any = None  # asks the end offsets for sync(), while the follower runs
        self._read_to: dict[Any, int] = {}  # partition -> offset read up to (its position)
        self._no_sync_until = 0.0  # loop time before which sync() answers False at once (it just failed)

    async def run(self) -> None:
        """Read forever (cancelled at shutdown); a failure to start or to reach the broker is retried."""
        from aiokafka.errors import KafkaError

        while True:
            try:
                await self._follow()
            except (KafkaError, asyncio.TimeoutError, OSError) as exc:
                self.caught_up = False
                log.warning("placement table: %s: %s; starting again", type(exc).__name__, exc)
                await asyncio.sleep(2.0)

    async def _follow(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.errors import KafkaError

        c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                             client_id="whywait-placement-table")
        # sync()'s end offsets on a client of their own: on the follower's connection the request waited
        # behind its long-poll fetch (up to fetch_max_wait_ms, 500 ms, with no new placement), and the
        # router syncs before every batch of telemetry: a 1,024-GPU backlog was routed at ~450 ms a batch
        # with the worker 80% idle.
        ends_client = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                       client_id="whywait-placement-ends")
        await c.start()
        try:
            await ends_client.start()
        except BaseException:
            await c.stop()
            raise
        try:
            n = await partitions_of(self.bootstrap, self.topic)
            tps = [TopicPartition(self.topic, p) for p in range(n)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            self._read_to = {}
            self._ends_client = ends_client
            self._consumer = c
            while True:
                try:
                    batch = await c.getmany(*tps, timeout_ms=500)
                    for msgs in batch.values():
                        for m in msgs:
                            self._one(m.value)
                    for tp in tps:
                        self._read_to[tp] = await c.position(tp)
                    ends = await c.end_offsets(tps)
                    self.caught_up = all(self._read_to[tp] >= ends[tp] for tp in tps)
                except (KafkaError, asyncio.TimeoutError, OSError) as exc:
                    # A broker restarting, or a machine too busy to answer in time: the table keeps
                    # what it has (it must never stop the worker) and reads on when the broker answers.
                    self.caught_up = False
                    log.warning("placement table: %s: %s; retrying", type(exc).__name__, exc)
                    await asyncio.sleep(1.0)
        finally:
            self._consumer = self._ends_client = None
            await c.stop()
            await ends_client.stop()

    async def sync(self, timeout_s: float = 5.0) -> bool:
        """Wait until every placement published before this call is applied; False if ``timeout_s`` passed
        (or the table is not following yet).

        Called by the router before it routes node telemetry it would otherwise key by node: a placement
        published before that telemetry was consumed is then known, so the telemetry goes to its job's
        worker (a job's first seconds of telemetry were keyed by node, and its worker's baselines missed them).
        """
        loop = asyncio.get_running_loop()
        if loop.time() < self._no_sync_until:
            return False  # it failed just now: do not hold every batch for the timeout while it is away
        ok = await self._sync(loop, timeout_s)
        if not ok:
            self._no_sync_until = loop.time() + 10.0
        return ok

    async def _sync(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> bool:
        deadline = loop.time() + timeout_s
        # At start-up the table may not follow yet: wait for it too (telemetry routed before it knows
        # any placement would all be keyed by node).
        while self._consumer is None or not self._read_to:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        c, ends_client = self._consumer, self._ends_client
        try:
            ends = await asyncio.wait_for(ends_client.end_offsets(list(self._read_to)), timeout_s)
        except Exception:  # noqa: BLE001 - the broker away: route with what is known
            return False
        while any(self._read_to.get(tp, 0) < end for tp, end in ends.items()):
            if loop.time() >= deadline or self._consumer is not c:
                return False
            await asyncio.sleep(0.05)
        return True

    def _one(self, value: bytes | None) -> None:
        if value is None:
            return
        try:
            msg = decode(value, self.topic)
        except ContractError:
            return  # the router dead-letters it, once, with its reason
        if self.not_before is not None and msg["time"] < self.not_before:
            return
        try:
            self.apply(msg)
            self.applied += 1
        except Exception as exc:  # noqa: BLE001 - a placement naming unknown nodes: the router says so
            log.debug("placement of job %s not applied: %s", msg.get("job"), exc)


async def read_compacted(bootstrap: str, topic: str, client_id: str = "whywait-compacted-read",
                         want: Callable[[bytes], bool] | None = None) -> dict[bytes | None, bytes | None]:
    """The newest value of every key of a compacted topic, read whole (all partitions, to the end
    offsets found at start); a tombstone reads as None, keyless records share the key None.

    ``want(key)`` keeps only the keys it accepts (before any value is held).  Called by the start-up
    read of placements (``whywait engine``) and by a partitioned worker for the incident checkpoints
    and notifier records of the jobs it gains.  Every partition is read: a consumer without a
    subscription does not know them (only partition 0 was read once, and a topic with more lost the rest).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    tps = [TopicPartition(topic, p) for p in range(await partitions_of(bootstrap, topic))]
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, client_id=client_id)
    await c.start()
    latest: dict[bytes | None, bytes | None] = {}
    try:
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        for tp in tps:
            while ends[tp] and await c.position(tp) < ends[tp]:
                batch = await c.getmany(tp, timeout_ms=1000)
                for m in batch.get(tp, []):
                    if want is None or (m.key is not None and want(m.key)):
                        latest[m.key] = m.value
    finally:
        await c.stop()
    return latest


async def read_job_states(bootstrap: str, group: str, want: Callable[[str], bool]) -> dict[str, dict[str, Any]]:
    """The newest per-job checkpoint of every job ``want`` accepts (empty ones left out)."""
    prefix = f"{group}|job|".encode()
    got = await read_compacted(bootstrap, TOPIC_ENGINE_STATE, "whywait-state-read",
                               lambda k: k.startswith(prefix) and want(k[len(prefix):].decode(errors="replace")))
    out: dict[str, dict[str, Any]] = {}
    for key, value in got.items():
        job = (key or b"")[len(prefix):].decode(errors="replace")
        if not value:
            continue
        try:
            state = jsonl.loads(value)
        except ValueError:
            log.warning("ignoring an unreadable checkpoint of job %s", job[:80])
            continue
        if state:
            out[job] = state
    return out


async def read_notify_state(bootstrap: str, want: Callable[[str], bool],
                            topic: str = "whywait.notify-state.v1") -> dict[str, dict[str, Any]]:
    """The notifier's incident records (by key) that hold a finding of a job ``want`` accepts.

    Read when a worker gains jobs: it adopts them (``Pipeline.adopt``), so an update of an incident
    another worker announced edits that worker's Slack message instead of posting a second one.
    """
    out = {}
    for key, value in (await read_compacted(bootstrap, topic, "whywait-notify-read")).items():
        try:
            rec = jsonl.loads(value) if value else None
        except ValueError:
            continue
        if key is None or not isinstance(rec, dict) or rec.get("status") == "resolved":
            continue
        members = rec.get("members") or {}
        if any(isinstance(m, dict) and isinstance(m.get("job"), str) and want(m["job"]) for m in members.values()):
            out[key.decode(errors="replace")] = rec
    return out


async def read_placements(bootstrap: str) -> list[dict[str, Any]]:
    """Return the newest valid placement of every job in the compacted placement topic.

    Called by ``whywait engine`` at start-up, before the faust worker runs: a restarted engine resumes
    each topic from its committed offset, and a job placed before that offset would otherwise stay
    unknown to it (and go unwatched) until its placement changed.  Invalid ones are left to the stream,
    which dead-letters them with their reason.
    """
    out = []
    for value in (await read_compacted(bootstrap, TOPIC_PLACEMENT, "whywait-placement-read")).values():
        if value is None:
            continue
        try:
            out.append(dict(decode(value, TOPIC_PLACEMENT)))
        except ContractError:
            continue
    return out


async def committed_offsets(bootstrap: str, group: str, tps: list[Any]) -> dict[Any, int]:
    """The consumer group's committed offset of each of ``tps`` (absent: none committed)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        got = await admin.list_consumer_group_offsets(group, partitions=tps)
    finally:
        await admin.close()
    return {tp: om.offset for tp, om in got.items() if om is not None and om.offset is not None and om.offset >= 0}


async def read_range(bootstrap: str, ranges: Mapping[Any, tuple[int, int]], feed: Callable[[list[Any]], None],
                     limit: int = 5_000_000) -> int:
    """Read the records at offsets ``[start, end)`` of each partition in ``ranges``; ``feed(records)`` gets
    them in batches.  Returns how many were fed (stops at ``limit``, or when a partition has nothing more)."""
    from aiokafka import AIOKafkaConsumer

    todo = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
    if not todo:
        return 0
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                client_id="whywait-range-read")
    await consumer.start()
    try:
        consumer.assign(list(todo))
        return await _read_ranges(consumer, todo, feed, limit)
    finally:
        await consumer.stop()


async def _read_ranges(consumer: Any, ranges: Mapping[Any, tuple[int, int]], feed: Callable[[list[Any]], None],
                       limit: int) -> int:
    """With ``consumer`` assigned the partitions of ``ranges``: seek each to its start, feed the records before its
    end, pause it there; return how many were fed (stops at ``limit``, or when a fetch brings nothing)."""
    for tp, (start, _) in ranges.items():
        consumer.seek(tp, start)
    n = 0
    live = dict(ranges)
    while live and n < limit:
        batch = await consumer.getmany(*live, timeout_ms=2000)
        if not batch:
            break
        for tp, recs in batch.items():
            end = ranges[tp][1]
            keep = [r for r in recs if r.offset < end]
            if keep:
                feed(keep)
                n += len(keep)
            if not recs or recs[-1].offset >= end - 1:
                live.pop(tp, None)
                consumer.pause(tp)
    return n


async def read_window(bootstrap: str, group: str, tps: list[Any], window_s: float,
                      feed: Callable[[list[Any]], None], limit: int = 5_000_000) -> int:
    """Re-read the last ``window_s`` of event time before the committed offset of each of ``tps``.

    The window ends at the group's committed offset C (what the previous owner finished) and
    starts at the first record whose timestamp (its event time) is at least the event time of
    record C-1 less ``window_s``, and never before the offset the group started at
    (:func:`read_group_start`: a group started with ``--latest`` re-reads nothing published before
    it existed).  ``feed(records)`` gets them in batches; returns how many.
    Nothing is read for a partition without a committed offset: the consumer starts it from the
    beginning (or the end, with ``--latest``) and the stream itself fills the window.
    """
    from aiokafka import AIOKafkaConsumer

    floor = await read_group_start(bootstrap, group)
    committed = await committed_offsets(bootstrap, group, tps)
    todo = {tp: c for tp, c in committed.items() if c > 0}
    if not todo:
        return 0
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                client_id="whywait-window-restore")
    await consumer.start()
    try:
        consumer.assign(list(todo))
        starts: dict[Any, int] = {}
        for tp, c in todo.items():
            consumer.seek(tp, c - 1)
            last = await consumer.getmany(tp, timeout_ms=5000)
            recs = last.get(tp) or []
            if not recs:
                continue
            target = int(recs[0].timestamp - window_s * 1000)
            found = await consumer.offsets_for_times({tp: max(0, target)})
            start = found[tp].offset if found.get(tp) is not None else c - 1
            starts[tp] = max(min(start, c), floor.get(f"{tp.topic}/{tp.partition}", 0))
        return await _read_ranges(consumer, {tp: (start, todo[tp]) for tp, start in starts.items()}, feed, limit)
    finally:
        await consumer.stop()



async def start_group_at_latest(bootstrap: str, group: str, topics: list[str]) -> int | None:
    """Commit the current end offset of every partition of ``topics`` for a consumer group that has none.

    Called by ``whywait engine --latest`` before its workers join.  Left to ``auto.offset.reset=latest``,
    each partition's start would be wherever its end happened to be when some worker first fetched it:
    with several workers the group rebalances while they join, the repartition topic is written by the
    routers before its readers have a position, and most of the input was skipped (1,378-4,507 of 22,614
    records routed in one measurement).  Committed up front, every worker resumes from one instant.
    Returns how many partitions were committed; None when the group already has offsets (it resumes
    from them) or has members (the broker refuses a commit from outside the group: it is running).
    """
    from aiokafka.errors import KafkaError

    for attempt in range(30):
        try:
            return await _start_group_at_latest(bootstrap, group, topics)
        except KafkaError as exc:
            # A new cluster has no group coordinator until its offsets topic exists: seconds.
            if not getattr(exc, "retriable", False) or attempt == 29:
                raise
            await asyncio.sleep(1.0)
    return None


async def _start_group_at_latest(bootstrap: str, group: str, topics: list[str]) -> int | None:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError
    from whywait.engine.stream.topics import topic_partitions_async

    counts = await topic_partitions_async(bootstrap, topics)
    tps = [TopicPartition(t, p) for t in topics if t in counts for p in range(counts[t])]
    if not tps or await committed_offsets(bootstrap, group, tps):
        return None
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                         client_id="whywait-group-start")
    await c.start()
    try:
        c.assign(tps)
        ends = await c.end_offsets(tps)
        try:
            await c.commit({tp: ends[tp] for tp in tps})
        except KafkaError as exc:  # members already: someone else started the group a moment ago
            log.info("engine: group %s not started at the latest offsets here (%s): it has members", group, exc)
            return None
    finally:
        await c.stop()
    # Where the group started, for every worker: a worker gaining a partition re-reads a window before the
    # committed offset, and for a new group that window is what others published before it existed.
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        await p.send_and_wait(TOPIC_ENGINE_STATE, json.dumps(
            {f"{tp.topic}/{tp.partition}": ends[tp] for tp in tps}, sort_keys=True).encode(),
            key=group_start_key(group))
    finally:
        await p.stop()
    return len(tps)


def group_start_key(group: str) -> bytes:
    """The compacted key under which :func:`start_group_at_latest` keeps where group ``group`` started."""
    return f"{group}|start".encode()


async def read_group_start(bootstrap: str, group: str) -> dict[str, int]:
    """``"topic/partition" -> offset`` where the group was started with ``--latest``; empty if it was not."""
    key = group_start_key(group)
    got = await read_compacted(bootstrap, TOPIC_ENGINE_STATE, "whywait-state-read", lambda k: k == key)
    try:
        raw = jsonl.loads(got.get(key) or b"{}")
        return {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    except (ValueError, TypeError, AttributeError):
        log.warning("ignoring an unreadable start record of group %s", group[:80])
        return {}
