"""Closing a notifier store stops its producer even when aiokafka's consumer.stop() re-raises the cancellation of
its own pending fetch (aio-libs/aiokafka#647): that CancelledError skipped the producer, which was never stopped."""

from __future__ import annotations

import asyncio

from whywait.engine.notify.kafka_kv import CompactedTopic


class _Client:
    def __init__(self, raises: BaseException | None = None) -> None:
        self.raises, self.stopped = raises, False

    async def stop(self) -> None:
        self.stopped = True
        if self.raises is not None:
            raise self.raises


def test_the_producer_is_stopped_though_the_consumer_stop_raises_cancelled() -> None:
    kv = CompactedTopic.__new__(CompactedTopic)  # no broker: only its shutdown path
    kv._follow_task = None
    kv._consumer, kv._producer = _Client(asyncio.CancelledError()), _Client()
    asyncio.run(kv._stop())
    assert kv._producer.stopped and kv._consumer.stopped
