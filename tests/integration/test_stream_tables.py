"""``engine/stream/tables.py`` against the real (session) broker: reading a compacted topic whole, and
reading an offset range (what a worker re-reads when another worker consumed part of its partition)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytestmark = pytest.mark.integration


async def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        for part, key, value in records:
            await p.send_and_wait(topic, value, key=key, partition=part)
    finally:
        await p.stop()


def test_read_compacted_takes_the_newest_of_every_key_on_every_partition(kafka_bootstrap: str,
                                                                          kafka_topic_factory: Any) -> None:
    from whywait.engine.stream.tables import read_compacted

    async def go() -> dict[bytes | None, bytes | None]:
        topic = await kafka_topic_factory(partitions=3, compacted=True, prefix="tables")
        await _produce(kafka_bootstrap, topic, [
            (0, b"a", b"1"), (2, b"b", b"1"), (0, b"a", b"2"),  # a newer value of a key wins
            (1, b"c", b"1"), (1, b"c", None),                    # a tombstone reads as None
            (2, b"d", b"1")])
        return await read_compacted(kafka_bootstrap, topic)

    got = asyncio.run(go())
    assert got == {b"a": b"2", b"b": b"1", b"c": None, b"d": b"1"}


def test_read_compacted_keeps_only_wanted_keys(kafka_bootstrap: str, kafka_topic_factory: Any) -> None:
    from whywait.engine.stream.tables import read_compacted

    async def go() -> dict[bytes | None, bytes | None]:
        topic = await kafka_topic_factory(partitions=2, compacted=True, prefix="tables")
        await _produce(kafka_bootstrap, topic, [(0, b"g|job|x", b"1"), (1, b"h|job|y", b"2"), (1, b"g|job|z", b"3")])
        return await read_compacted(kafka_bootstrap, topic, want=lambda k: k.startswith(b"g|"))

    assert asyncio.run(go()) == {b"g|job|x": b"1", b"g|job|z": b"3"}


def test_read_range_feeds_exactly_the_offsets_asked_for(kafka_bootstrap: str, kafka_topic_factory: Any) -> None:
    from aiokafka import TopicPartition
    from whywait.engine.stream.tables import read_range

    async def go() -> tuple[int, list[tuple[int, int]]]:
        topic = await kafka_topic_factory(partitions=2, prefix="tables")
        await _produce(kafka_bootstrap, topic, [(p, None, f"{p}:{i}".encode()) for i in range(10) for p in (0, 1)])
        fed: list[tuple[int, int]] = []
        n = await read_range(kafka_bootstrap, {TopicPartition(topic, 0): (3, 7), TopicPartition(topic, 1): (8, 8)},
                             lambda recs: fed.extend((r.partition, r.offset) for r in recs))
        return n, fed

    n, fed = asyncio.run(go())
    assert n == 4
    assert fed == [(0, 3), (0, 4), (0, 5), (0, 6)]  # an empty range reads nothing


def test_read_window_rereads_the_event_time_window_before_the_committed_offset(kafka_bootstrap: str,
                                                                               kafka_topic_factory: Any) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata
    from whywait.engine.stream.tables import read_window

    async def go() -> tuple[int, list[int]]:
        topic = await kafka_topic_factory(partitions=1, prefix="tables")
        tp = TopicPartition(topic, 0)
        p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await p.start()
        try:  # record i stamped at t0 + 10 s * i: its event time
            for i in range(10):
                await p.send_and_wait(topic, f"{i}".encode(), partition=0, timestamp_ms=1_700_000_000_000 + 10_000 * i)
        finally:
            await p.stop()
        group = f"window-{topic}"
        c = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
        await c.start()
        try:  # the previous owner finished offsets 0-7
            c.assign([tp])
            await c.commit({tp: OffsetAndMetadata(8, "")})
        finally:
            await c.stop()
        fed: list[int] = []
        n = await read_window(kafka_bootstrap, group, [tp], 25.0, lambda recs: fed.extend(r.offset for r in recs))
        return n, fed

    n, fed = asyncio.run(go())
    # record 7 is at +70 s: the window reaches back to +45 s, so records 5, 6 and 7; nothing at or past the commit
    assert (n, fed) == (3, [5, 6, 7])


def test_placement_table_sync_applies_every_placement_published_before_it(kafka_bootstrap: str) -> None:
    """The router's guard against the placement race: telemetry consumed right after its job's placement
    was published must be routed with that placement known (else it is keyed by node and the job's worker
    never sees it). ``sync`` returns only when the table has applied what the topic held when it was called."""
    import time

    from whywait.agents.events import TOPIC_PLACEMENT, encode, envelope
    from whywait.engine.stream.tables import PlacementTable
    from whywait.engine.stream.topics import ensure_topics

    ensure_topics(kafka_bootstrap)
    tag = f"sync-{time.time_ns()}"
    applied: list[str] = []

    def placement(job: str) -> bytes:
        return encode(envelope("placement", "sched", time.time() + 55 * 86_400, job=job, project="p", team="t",
                               state="running", ranks=[{"rank": 0, "node": "node-01", "gpu": 0}]))

    def produce_blocking(job: str) -> None:
        # On another thread while this loop is blocked: the table cannot read it before sync() is called.
        import threading

        th = threading.Thread(target=lambda: asyncio.run(
            _produce(kafka_bootstrap, TOPIC_PLACEMENT, [(0, job.encode(), placement(job))])))
        th.start()
        th.join()

    async def go() -> tuple[bool, bool, int]:
        produce_blocking(f"{tag}-a")
        table = PlacementTable(kafka_bootstrap, lambda m: applied.append(m["job"]))
        task = asyncio.ensure_future(table.run())
        try:
            # Called before the table follows the topic: it waits for it rather than answering at once.
            first = await table.sync(timeout_s=60) and f"{tag}-a" in applied
            produce_blocking(f"{tag}-b")
            assert f"{tag}-b" not in applied
            ok = await table.sync(timeout_s=60)  # published while the table follows: known when sync returns
            return first, ok, applied.count(f"{tag}-b")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    first, ok, n = asyncio.run(go())
    assert first, applied[-5:]
    assert ok and n == 1, applied[-5:]


def test_start_group_at_latest_commits_every_end_once(kafka_bootstrap: str, kafka_topic_factory: Any) -> None:
    """``whywait engine --latest``: a new group starts at the ends of every partition, committed before any
    worker joins; a group with offsets (or members) is left alone, so a restart resumes where it was."""
    import time

    from aiokafka import AIOKafkaConsumer, TopicPartition
    from whywait.engine.stream.tables import committed_offsets, read_group_start, read_window, start_group_at_latest

    group = f"latest-{time.time_ns()}"

    async def go() -> tuple[int | None, dict[Any, int], int | None, int | None]:
        topic = await kafka_topic_factory(partitions=3, prefix="tables")
        await _produce(kafka_bootstrap, topic, [(p, None, b"x") for p in (0, 1, 1, 2, 2, 2)])
        first = await start_group_at_latest(kafka_bootstrap, group, [topic])
        tps = [TopicPartition(topic, p) for p in range(3)]
        got = await committed_offsets(kafka_bootstrap, group, tps)
        assert await read_group_start(kafka_bootstrap, group) == {f"{topic}/0": 1, f"{topic}/1": 2, f"{topic}/2": 3}
        await _produce(kafka_bootstrap, topic, [(0, None, b"y")])
        again = await start_group_at_latest(kafka_bootstrap, group, [topic])
        # A worker gaining partition 0 later re-reads a window before the commit, never before the group's start.
        c = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            c.assign(tps[:1])
            await c.commit({tps[0]: 2})
        finally:
            await c.stop()
        fed: list[bytes] = []
        n = await read_window(kafka_bootstrap, group, tps[:1], 10 * 86_400.0,
                              lambda rs: fed.extend(r.value for r in rs))
        assert (n, fed) == (1, [b"y"])
        # A running group (a member joined) refuses a commit from outside: left alone.
        busy = f"{group}-busy"
        member = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=busy,
                                  enable_auto_commit=False, auto_offset_reset="earliest")
        await member.start()
        try:
            await member.getmany(timeout_ms=3000)  # joined and assigned
            running = await start_group_at_latest(kafka_bootstrap, busy, [topic])
        finally:
            await member.stop()
        return first, {tp.partition: o for tp, o in got.items()}, again, running

    first, got, again, running = asyncio.run(go())
    assert first == 3 and got == {0: 1, 1: 2, 2: 3}
    assert again is None
    assert running is None
