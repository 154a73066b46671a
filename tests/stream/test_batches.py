"""BatchFeed: what the engine's processors take from faust's consumer, and which offsets they let it commit."""

from __future__ import annotations

import asyncio
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


def test_round_robin_takes_one_record_of_each_partition_in_turn() -> None:
    got = list(round_robin({A: [1, 2, 3], B: [10]}))
    assert got == [1, 10, 2, 3]
    assert list(round_robin({A: [1, 2]})) == [1, 2]
