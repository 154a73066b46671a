"""BatchFeed: what the engine's processors take from faust's consumer, and which offsets they let it commit."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from faust.types import TP
from whywait.engine.stream.batches import Batch, BatchFeed, round_robin

A, B = TP("whywait.gpu.v1", 0), TP("whywait.net.v1", 0)


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int


def batch(tp: TP, first: int, last: int) -> Batch:
    return Batch([Rec(tp.topic, tp.partition, o) for o in range(first, last + 1)], {tp: first}, {tp: last})


async def take(feed: BatchFeed) -> Batch:
    return await asyncio.wait_for(feed.__aiter__().__anext__(), 1.0)


def test_offsets_are_committable_only_once_a_batch_is_done() -> None:
    async def run() -> None:
        feed = BatchFeed([A.topic])
        await feed.put(batch(A, 0, 9))
        got = await take(feed)
        assert [r.offset for r in got.records] == list(range(10))
        assert feed.commit_at == {} and feed.busy is got and not await feed.wait_idle(0.01)
        feed.done(got)
        assert feed.commit_at == {A: 10} and feed.busy is None and await feed.wait_idle(0.01)

    asyncio.run(run())


def test_records_delivered_again_are_dropped_and_a_released_batch_is_not() -> None:
    async def run() -> None:
        feed = BatchFeed([A.topic])
        it = feed.__aiter__()
        await feed.put(batch(A, 0, 9))
        feed.done(await it.__anext__())
        await feed.put(batch(A, 5, 14))  # the group re-read from an older commit
        again = await it.__anext__()
        assert [r.offset for r in again.records] == list(range(10, 15)) and feed.dropped == 5
        feed.release(again)  # cancelled: neither committed nor skipped when read again
        assert feed.commit_at == {A: 10}
        await feed.put(batch(A, 10, 14))
        assert [r.offset for r in (await it.__anext__()).records] == list(range(10, 15))

    asyncio.run(run())


def test_a_rebalance_drops_waiting_batches_and_forgets_revoked_offsets() -> None:
    async def run() -> None:
        feed = BatchFeed([A.topic, B.topic])
        it = feed.__aiter__()
        await feed.put(batch(A, 0, 4))
        feed.done(await it.__anext__())
        await feed.put(batch(B, 0, 4))
        feed.revoked({A, B})
        assert feed.queue.empty() and feed.dropped == 5
        feed.forget({A})
        assert feed.commit_at == {}

    asyncio.run(run())


def test_a_fetch_put_after_the_revoke_is_not_handed_over_ahead_of_the_re_read() -> None:
    """The sequence of a 2-worker bench run that lost 2,392 of 44,289 records: the router evaluates one fetch,
    two more wait in the queue and the fetcher waits for room with a fourth; the revoke empties the queue and
    the fourth goes in after it.  Handed over, it made the feed count the partition handed up to its end, and
    the re-read from the committed offset (the two dropped fetches) was dropped as delivered again."""
    async def run() -> None:
        counts: Counter[str] = Counter()
        feed = BatchFeed([A.topic], counts=counts, name="route")
        it = feed.__aiter__()

        def fetch(first: int, last: int) -> Batch:
            return feed.make({A: [Rec(A.topic, A.partition, o) for o in range(first, last + 1)]})

        await feed.put(fetch(0, 294))
        busy = await asyncio.wait_for(it.__anext__(), 1.0)
        await feed.put(fetch(295, 567))
        await feed.put(fetch(568, 847))
        waiting = asyncio.ensure_future(feed.put(fetch(848, 1135)))  # the fetcher, waiting for room
        await asyncio.sleep(0.01)
        assert not waiting.done()
        feed.revoked({A})  # empties the queue; the waiting fetch goes in after it
        await asyncio.wait_for(waiting, 1.0)
        feed.done(busy)
        assert feed.commit_at == {A: 295}
        feed.forget({A})
        # The partition comes back (to this worker or another): faust re-reads it from the committed offset.
        handed = [r.offset for r in busy.records]
        for first, last in ((295, 567), (568, 847), (848, 1135)):
            await feed.put(fetch(first, last))
            got = await asyncio.wait_for(it.__anext__(), 1.0)
            handed += [r.offset for r in got.records]
            feed.done(got)
        assert handed == list(range(1136))  # every record once, in order
        assert feed.commit_at == {A: 1136}
        assert counts == {"route.feed_stale": 1135 - 295 + 1}  # the three fetches of the revoked assignment

    asyncio.run(run())


def test_a_hole_between_two_fetches_of_one_partition_is_counted_and_a_new_epoch_may_start_anywhere() -> None:
    async def run() -> None:
        counts: Counter[str] = Counter()
        feed = BatchFeed([A.topic], counts=counts, name="evaluate")
        it = feed.__aiter__()
        for first, last in ((0, 9), (15, 19)):
            await feed.put(feed.make({A: [Rec(A.topic, 0, o) for o in range(first, last + 1)]}))
            feed.done(await asyncio.wait_for(it.__anext__(), 1.0))
        assert counts == {"evaluate.feed_gap": 5}
        feed.revoked({A})
        # Another worker had the partition meanwhile and committed further on: no hole of this worker's.
        await feed.put(feed.make({A: [Rec(A.topic, 0, o) for o in range(40, 45)]}))
        got = await asyncio.wait_for(it.__anext__(), 1.0)
        assert [r.offset for r in got.records] == list(range(40, 45)) and counts == {"evaluate.feed_gap": 5}

    asyncio.run(run())


def test_a_feed_that_commits_by_hand_commits_only_what_it_is_told_and_never_backwards() -> None:
    async def run() -> None:
        feed = BatchFeed([A.topic], commit_on_done=False)
        await feed.put(batch(A, 0, 9))
        got = await take(feed)
        feed.done(got)
        assert feed.commit_at == {} and feed.busy is None  # in the reorder buffer, not evaluated
        feed.commit(A, 4)
        feed.commit(A, 2)
        feed.commit(A, None)
        assert feed.commit_at == {A: 4}

    asyncio.run(run())


def test_round_robin_takes_one_record_of_each_partition_in_turn() -> None:
    got = list(round_robin({A: [1, 2, 3], B: [10]}))
    assert got == [1, 10, 2, 3]
    assert list(round_robin({A: [1, 2]})) == [1, 2]


def test_the_first_offset_fetched_since_the_last_rebalance_is_known_per_partition() -> None:
    # The partitioned engine's progress markers count a gained partition's unrouted records from here, not
    # from offset 0 (which held every worker's evaluate stage for 30 s after a rebalance).
    feed = BatchFeed([A.topic, B.topic])
    assert feed.fetched_first(A) is None
    feed.make({A: [Rec(A.topic, 0, o) for o in range(120, 130)]})
    feed.make({A: [Rec(A.topic, 0, o) for o in range(130, 140)], B: [Rec(B.topic, 0, 7)]})
    assert (feed.fetched_first(A), feed.fetched_first(B)) == (120, 7)
    feed.revoked({A, B})
    assert feed.fetched_first(A) is None and feed.fetched_first(B) is None
    feed.make({A: [Rec(A.topic, 0, o) for o in range(300, 310)]})
    assert feed.fetched_first(A) == 300


def test_the_engine_consumer_waits_at_most_fetch_max_wait_ms_on_idle_partitions() -> None:
    # faust hard-codes 1,500 ms; with it a backlog of the repartition topic was read in bursts 1.4 s apart.
    import faust
    from whywait.engine.stream import batches

    async def run() -> None:
        app = faust.App("test-fetch-wait", broker="kafka://127.0.0.1:1", store="memory://")
        batches.install(app, BatchFeed([A.topic]))
        thread = app.consumer._thread  # type: ignore[attr-defined]
        assert isinstance(thread, batches.BatchConsumerThread)
        consumer = thread._create_worker_consumer(app.transport)  # made, not started: no broker needed
        try:
            assert consumer._fetch_max_wait_ms == batches.FETCH_MAX_WAIT_MS == 100
        finally:
            await consumer.stop()

    asyncio.run(run())
