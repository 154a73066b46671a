"""Creating whywait's topics with aiokafka's admin client, before anything uses them.

Called by ``whywait engine``, ``whywait simulate`` and the demo at start.  Topics
are created here rather than by faust because faust declares topics with its
own request versions; creating them up front with aiokafka (which negotiates
versions with the broker) works on Kafka 4, and faust runs with
``topic_allow_declare=False``.
"""

from __future__ import annotations

import asyncio

from whywait.agents.events import INPUT_TOPICS, TOPIC_DEADLETTER, TOPIC_DIAGNOSES, TOPIC_PLACEMENT
from whywait.engine.errors import BrokerUnavailable

TOPIC_ENGINE_STATE = "whywait.engine-state.v1"
COMPACTED = {TOPIC_PLACEMENT, TOPIC_ENGINE_STATE}


def all_topics() -> list[str]:
    """Every topic the engine reads or writes."""
    return [*INPUT_TOPICS, TOPIC_DIAGNOSES, TOPIC_DEADLETTER, TOPIC_ENGINE_STATE]


async def ensure_topics_async(bootstrap: str, topics: list[str] | None = None, partitions: int = 1,
                              replication: int = 1, timeout_s: float = 15.0) -> list[str]:
    """Create the missing topics (compacted where the contract says so); return the ones created."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaConnectionError, KafkaError

    topics = topics or all_topics()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except (asyncio.TimeoutError, KafkaConnectionError, KafkaError, OSError) as exc:
        raise BrokerUnavailable(bootstrap, type(exc).__name__) from None
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(t, partitions, replication,
                        topic_configs={"cleanup.policy": "compact"} if t in COMPACTED else {})
               for t in topics if t not in existing]
        if new:
            await admin.create_topics(new)
        return [t.name for t in new]
    finally:
        await admin.close()


def ensure_topics(bootstrap: str, topics: list[str] | None = None) -> list[str]:
    """Synchronous wrapper of :func:`ensure_topics_async` for command-line code."""
    return asyncio.run(ensure_topics_async(bootstrap, topics))
