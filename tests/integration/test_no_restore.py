"""``whywait engine --no-restore`` starts the notifier's message map empty (it used to reopen the last run's)."""

from __future__ import annotations

import uuid

import pytest
from whywait.engine.commands.engine_cmd import fresh_state_store
from whywait.engine.notify.state import KafkaStateStore

pytestmark = pytest.mark.integration


def test_fresh_state_store_loads_nothing_but_still_writes(kafka_bootstrap: str) -> None:
    topic = f"test.notify-state.{uuid.uuid4().hex[:8]}"
    old = KafkaStateStore(kafka_bootstrap, topic=topic)
    old.put("incident-1", {"ts": "1.0", "status": "firing"})
    old.close()

    fresh = fresh_state_store(kafka_bootstrap, topic=topic)
    try:
        assert fresh.load() == {}
        fresh.put("incident-2", {"ts": "2.0", "status": "firing"})
    finally:
        fresh.close()

    later = KafkaStateStore(kafka_bootstrap, topic=topic)  # the next normal restart resumes this run
    try:
        assert set(later.load()) == {"incident-1", "incident-2"}
    finally:
        later.close()


@pytest.mark.parametrize("value", [b"{not json", b"[" * 100_000, b'["a", "list"]', b"42"])
def test_a_damaged_checkpoint_is_ignored_not_fatal(kafka_bootstrap: str, value: bytes) -> None:
    """The newest checkpoint of the group is not a snapshot: the engine starts without it (it crashed at start)."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from whywait.engine.commands.engine_cmd import read_snapshot
    from whywait.engine.stream.topics import TOPIC_ENGINE_STATE, ensure_topics

    ensure_topics(kafka_bootstrap)
    group = f"test-group-{uuid.uuid4().hex[:8]}"

    async def put() -> None:
        p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=4 << 20)
        await p.start()
        try:
            await p.send_and_wait(TOPIC_ENGINE_STATE, b'{"incidents": []}', key=group.encode(), partition=0)
            await p.send_and_wait(TOPIC_ENGINE_STATE, value, key=group.encode(), partition=0)
        finally:
            await p.stop()

    asyncio.run(put())
    assert asyncio.run(read_snapshot(kafka_bootstrap, group)) is None
