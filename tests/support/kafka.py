"""Kafka helpers for tests: unique topic names and topic creation through aiokafka's admin client.

aiokafka is imported lazily so that collecting unit tests never needs it.
"""

from __future__ import annotations

import uuid
from typing import Mapping


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
