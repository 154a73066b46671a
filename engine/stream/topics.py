"""Creating whywait's topics with aiokafka's admin client, before anything uses them.

Called by ``whywait engine``, ``whywait simulate`` and the demo at start.  Topics
are created here rather than by faust because faust declares topics with its
own request versions; creating them up front with aiokafka (which negotiates
versions with the broker) works on Kafka 4, and faust runs with
``topic_allow_declare=False``.

**Partitions.**  The input topics and the internal :data:`TOPIC_BY_JOB` get ``partitions``
partitions (``whywait engine --partitions N``, ``$WHYWAIT_PARTITIONS``; default 1).  A partition is
the unit of work a worker takes, so N partitions let up to N workers share the load.  Size it
for the workers you may run, not the ones you run today: 2-4x the largest worker count you expect
(partitions can be added later, but adding them moves keys between partitions), and no more than
a few per job (a job is evaluated on one worker, whatever the count).  Topics that already exist
with fewer partitions are grown to ``partitions``; existing topics are never shrunk.

**Replication.**  ``replication`` (``$WHYWAIT_REPLICATION``; default 1, 3 on a 3-broker cluster) is
the replication factor of every topic created here; ``min.insync.replicas`` is set to 2 when it is
at least 3, so a write acknowledged by ``acks=all`` survives one broker lost.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterable

from whywait.agents.events import INPUT_TOPICS, TOPIC_DEADLETTER, TOPIC_DIAGNOSES, TOPIC_PLACEMENT
from whywait.engine.errors import BrokerUnavailable

log = logging.getLogger(__name__)

TOPIC_ENGINE_STATE = "whywait.engine-state.v1"
# The partitioned engine's repartition topic (see engine/stream/partitioning.py): input messages
# forwarded to the partition of the job that evaluates them.  Records carry their *event time* as
# their timestamp, so a worker that gains a partition finds the start of the window it must
# re-read with offsets-for-times; timestamps far from the broker's clock (replays, simulations)
# must be accepted, and retention is by size, never by those timestamps.
TOPIC_BY_JOB = "whywait.by-job.v1"
# The notifier's compacted tables (engine/notify): created here too, so they get the same replication
# factor as the rest (the notifier creates them with one replica when they are missing).
TOPIC_NOTIFY_STATE = "whywait.notify-state.v1"
TOPIC_SILENCES = "whywait.silences.v1"
COMPACTED = {TOPIC_PLACEMENT, TOPIC_ENGINE_STATE, TOPIC_NOTIFY_STATE, TOPIC_SILENCES}
_LONG_MAX = str(2**63 - 1)
TOPIC_CONFIGS: dict[str, dict[str, str]] = {
    TOPIC_BY_JOB: {"message.timestamp.type": "CreateTime", "retention.ms": "-1",
                   "retention.bytes": str(1 << 30),  # per partition
                   "message.timestamp.after.max.ms": _LONG_MAX, "message.timestamp.before.max.ms": _LONG_MAX},
}
# Topics whose partition count follows ``--partitions``: the inputs the consumer group splits, and
# the repartition topic.  The others (diagnoses, dead letters, state) have one partition.
SCALED = {*INPUT_TOPICS, TOPIC_BY_JOB}


def all_topics() -> list[str]:
    """Every topic the engine reads or writes."""
    return [*INPUT_TOPICS, TOPIC_DIAGNOSES, TOPIC_DEADLETTER, TOPIC_ENGINE_STATE, TOPIC_BY_JOB,
            TOPIC_NOTIFY_STATE, TOPIC_SILENCES]


def env_int(name: str, default: int, env: dict[str, str] | None = None) -> int:
    """A positive integer from the environment (``$WHYWAIT_PARTITIONS``...), else ``default``."""
    import os

    from whywait.engine.errors import ConfigError

    raw = (env if env is not None else os.environ).get(name, "").strip()
    if not raw:
        return default
    try:
        val = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number >= 1 (got {raw!r})") from None
    if val < 1:
        raise ConfigError(f"{name} must be a whole number >= 1 (got {raw!r})")
    return val


async def ensure_topics_async(bootstrap: str, topics: list[str] | None = None, partitions: int = 1,
                              replication: int = 1, timeout_s: float = 15.0) -> list[str]:
    """Create the missing topics (compacted where the contract says so); return the ones created.

    Input topics and the repartition topic get ``partitions`` partitions; one that exists with
    fewer is grown to ``partitions`` (never shrunk).  Every topic gets ``replication`` replicas.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
    from aiokafka.errors import KafkaConnectionError, KafkaError

    topics = topics or all_topics()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except (asyncio.TimeoutError, KafkaConnectionError, KafkaError, OSError) as exc:
        raise BrokerUnavailable(bootstrap, type(exc).__name__) from None
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(t, partitions if t in SCALED else 1, replication, topic_configs={
            **({"cleanup.policy": "compact"} if t in COMPACTED else {}),
            **({"min.insync.replicas": "2"} if replication >= 3 else {}),
            **({"min.compaction.lag.ms": "0", "segment.ms": "3600000"} if t in (TOPIC_NOTIFY_STATE, TOPIC_SILENCES)
               else {}), **TOPIC_CONFIGS.get(t, {})})
               for t in topics if t not in existing]
        if new:
            refused(await admin.create_topics(new), replication)
        if replication > 1:
            warn_under_replicated(await replica_counts(admin, [t for t in topics if t in existing]), replication)
        if partitions > 1:
            have = await partition_counts(admin, [t for t in topics if t in SCALED and t in existing])
            grow = {t: NewPartitions(partitions) for t, n in have.items() if n < partitions}
            if grow:
                await admin.create_partitions(grow)
        return [t.name for t in new]
    finally:
        await admin.close()


def refused(response: object, replication: int) -> None:
    """Raise when the broker refused to create a topic; the admin client returns its answer, never raises.

    A topic another worker created meanwhile (``TOPIC_ALREADY_EXISTS``) is fine.  An error Kafka calls
    retriable (no controller yet, a timeout) is a ``KafkaError`` for :func:`engine_partitions` to retry;
    anything else (too few brokers for ``--replication``, no permission, a policy) is a
    :class:`~whywait.engine.errors.ConfigError` naming the topic and the broker's reason, instead of the
    topics going missing and the engine later saying the broker is unreachable.
    """
    from aiokafka.errors import InvalidReplicationFactorError, KafkaError, TopicAlreadyExistsError, for_code
    from whywait.engine.errors import ConfigError

    errors = [(str(e[0]), int(e[1]), str(e[2] or "") if len(e) > 2 else "")
              for e in getattr(response, "topic_errors", []) or []]
    bad = [(t, code, msg) for t, code, msg in errors if code and code != TopicAlreadyExistsError.errno]
    if not bad:
        return
    topic, code, msg = bad[0]
    err = for_code(code)
    reason = f"{err.message}{': ' + msg if msg else ''}"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    if err.retriable:
        raise KafkaError(f"creating topic {topic}{more}: {reason}")
    hint = f" (--replication / WHYWAIT_REPLICATION is {replication})" if err is InvalidReplicationFactorError else ""
    raise ConfigError(f"Kafka refused to create topic {topic}{more}: {reason}{hint}")


async def partition_counts(admin: object, topics: list[str]) -> dict[str, int]:
    """The partition count of each topic in ``topics`` that exists (aiokafka's admin client)."""
    if not topics:
        return {}
    meta = await admin.describe_topics(topics)  # type: ignore[attr-defined]
    return {m["topic"]: len(m["partitions"]) for m in meta if not m.get("error_code") and m.get("partitions")}


async def replica_counts(admin: object, topics: list[str]) -> dict[str, int]:
    """The fewest replicas of any partition of each topic in ``topics`` that exists."""
    if not topics:
        return {}
    meta = await admin.describe_topics(topics)  # type: ignore[attr-defined]
    return {m["topic"]: min(len(p.get("replicas") or ()) for p in m["partitions"])
            for m in meta if not m.get("error_code") and m.get("partitions")}


def warn_under_replicated(counts: dict[str, int], replication: int) -> list[str]:
    """Say, in one warning, which existing topics have fewer replicas than ``--replication`` asks; return them.

    ``--replication`` applies to the topics created here: one that already existed (an earlier run, a
    simulation, or the broker's auto-creation when agents published first) kept its replicas, and the
    engine went on as if the flag had been applied.
    """
    short = sorted(t for t, n in counts.items() if n < replication)
    if short:
        fewest = min(counts[t] for t in short)
        names = ", ".join(short[:3]) + (f" and {len(short) - 3} more" if len(short) > 3 else "")
        log.warning("%d existing topic(s) have fewer replicas than --replication %d (as few as %d: %s); "
                    "Kafka keeps a topic's replication when it exists: raise it with "
                    "kafka-reassign-partitions.sh, or delete and recreate the topics", len(short), replication,
                    fewest, names)
    return short


async def topic_partitions_async(bootstrap: str, topics: list[str], timeout_s: float = 15.0) -> dict[str, int]:
    """The partition count of each of ``topics`` that exists."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        return await partition_counts(admin, topics)
    finally:
        await admin.close()


def engine_partitions(bootstrap: str, requested: int, replication: int = 1) -> int:
    """Create or grow the engine's topics for ``requested`` partitions; return the repartition topic's count.

    Called by ``whywait engine`` at start.  Every worker of a group reads the same count from the
    broker (a worker started with a smaller ``--partitions`` than the topics have follows the
    topics), so they agree on where each job is evaluated; more than 1 runs the partitioned pipeline.
    """
    import time

    from aiokafka.errors import KafkaError

    for attempt in range(6):
        # Workers started together on a fresh cluster race to create the topics, and a broker that
        # has just started answers "not ready" for a moment: both pass, so they are retried.
        try:
            ensure_topics(bootstrap, partitions=requested, replication=replication)
            counts = asyncio.run(topic_partitions_async(bootstrap, [*INPUT_TOPICS, TOPIC_BY_JOB]))
            have = max(counts.values(), default=1)
            if have > counts.get(TOPIC_BY_JOB, 1):  # inputs grown by an earlier run: the repartition topic follows
                ensure_topics(bootstrap, partitions=have, replication=replication)
            if counts.get(TOPIC_BY_JOB) is None or len(counts) < len(INPUT_TOPICS) + 1:
                raise KafkaError("topics not visible yet")
            return max(have, counts[TOPIC_BY_JOB])
        except (KafkaError, asyncio.TimeoutError, TimeoutError, OSError) as exc:
            if attempt == 5:
                raise BrokerUnavailable(bootstrap, f"creating topics: {type(exc).__name__}: {exc}") from None
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


async def wait_for_leaders(producer: Any, topics: Iterable[str] | None = None, timeout_s: float = 15.0) -> None:
    """Wait until ``producer`` sees a leader for every partition of ``topics`` (default: the input topics).

    Called by the command-line producers (``import``, ``simulate``) after :func:`ensure_topics_async`:
    a topic just created has no leader for a moment, and a send then fails with NotLeaderForPartition
    instead of waiting.  Returns after ``timeout_s`` at most; a send then reports what is still wrong.
    """
    from aiokafka.structs import TopicPartition

    want = list(topics if topics is not None else INPUT_TOPICS)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        await producer.client.force_metadata_update()
        meta = producer.client.cluster
        missing = [t for t in want if not meta.partitions_for_topic(t)
                   or any(meta.leader_for_partition(TopicPartition(t, p)) in (None, -1)
                          for p in meta.partitions_for_topic(t))]
        if not missing or asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.2)


def ensure_topics(bootstrap: str, topics: list[str] | None = None, partitions: int = 1,
                  replication: int = 1) -> list[str]:
    """Synchronous wrapper of :func:`ensure_topics_async` for command-line code."""
    return asyncio.run(ensure_topics_async(bootstrap, topics, partitions, replication))
