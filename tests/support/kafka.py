"""Kafka helpers for tests: unique topic names and topic creation through aiokafka's admin client.

aiokafka is imported lazily so that collecting unit tests never needs it.
"""

from __future__ import annotations

import uuid
from typing import Callable, Mapping


def unique_topic(prefix: str = "test") -> str:
    """A topic name no other test (or test run against the same broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def create_topic(
    bootstrap: str,
    name: str | None = None,
    *,
    partitions: int = 1,
    compacted: bool = False,
    config: Mapping[str, str] | None = None,
    prefix: str = "test",
) -> str:
    """Create a topic (replication factor 1) and return its name; a unique one when ``name`` is None.

    ``compacted=True`` sets ``cleanup.policy=compact``.  An existing topic is not an error.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    name = name or unique_topic(prefix)
    configs = dict(config or {})
    if compacted:
        configs["cleanup.policy"] = "compact"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
        for topic, code, message in getattr(response, "topic_errors", []):
            if code not in (0, TopicAlreadyExistsError.errno):
                raise RuntimeError(f"creating topic {topic!r} failed: error {code} {message or ''}".strip())
    finally:
        await admin.close()
    return name


async def publish_messages(bootstrap: str, msgs: list[tuple[str, dict]]) -> None:
    """Publish contract messages ``(topic, message)`` with their contract keys, in order, and wait."""
    from aiokafka import AIOKafkaProducer
    from whywait.agents.events import encode, message_key

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await p.start()
    try:
        for topic, m in msgs:
            await p.send(topic, encode(m), key=message_key(m))
    finally:
        await p.stop()


def wait_for(pred: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll ``pred`` every 0.2 s until it is true (True) or ``timeout`` passes (False)."""
    import time

    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False
