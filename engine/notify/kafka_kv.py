"""A compacted Kafka topic used as a key → JSON table, from synchronous code.

The notifier's state (``whywait.notify-state.v1``) and the silences
(``whywait.silences.v1``) are each kept this way: the latest value per key is the
truth, a ``None`` value (tombstone) deletes the key, and Kafka's log compaction
keeps the topic as small as the table.  On start the whole topic is read up to its
end offsets; with ``follow=True`` it keeps being read in the background, so writes
from other processes show up in :meth:`CompactedTopic.snapshot`; :meth:`CompactedTopic.read_to_end`
reads them up to the broker's end offsets of the moment, following or not.

aiokafka is asynchronous and the notifier is not, so each table runs its own event
loop in a daemon thread and the public methods wait on it.  aiokafka is imported
here only, lazily (the pure core and the console path never load it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, Coroutine, TypeVar

from whywait.engine.errors import BrokerUnavailable, NotifyError

from whywait import jsonl

log = logging.getLogger(__name__)

T = TypeVar("T")


class CompactedTopic:
    """The latest JSON value of each key in ``topic`` (created compacted if missing)."""

    def __init__(self, bootstrap: str, topic: str, *, follow: bool = False, client_id: str = "whywait-notify",
                 partitions: int = 1, replication: int = 1) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.follow = follow
        self._client_id = client_id
        self._partitions = partitions
        self._replication = replication
        self._table: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"kafka-{topic}", daemon=True)
        self._producer: Any = None
        self._consumer: Any = None
        self._follow_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    # ---- sync facade -----------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise BrokerUnavailable(self.bootstrap, f"no answer within {timeout:.0f}s ({self.topic})") from None

    def start(self, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """Create the topic if needed, read it to its end, and return the table."""
        if self._started:
            return self.snapshot()
        self._thread.start()
        try:
            self._run(self._start(), timeout)
        except Exception:
            self.close()
            raise
        self._started = True
        return self.snapshot()

    def put(self, key: str, value: dict[str, Any] | None, timeout: float = 15.0) -> None:
        """Write ``value`` (None: delete) for ``key`` and wait until the broker has it."""
        data = None if value is None else json.dumps(value, separators=(",", ":")).encode()
        with self._lock:
            if value is None:
                self._table.pop(key, None)
            else:
                self._table[key] = value
        self._run(self._send(key, data), timeout)

    def read_to_end(self, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
        """Read what other processes wrote, up to the end offsets the broker has now, and return the table.

        What :meth:`snapshot` cannot promise: a table not following (``follow=False``) stops at the offsets
        of its start, and a following one lags.  Raises like :meth:`start` when the broker does not answer.
        """
        if not self._started:
            return self.start(timeout)
        self._run(self._catch_up(), timeout)
        return self.snapshot()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """A copy of the table as last read or written."""
        with self._lock:
            return dict(self._table)

    def close(self) -> None:
        """Stop the background reader, the producer and the consumer; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            try:
                self._run(self._stop(), 15.0)
            except Exception as exc:  # closing must not raise over the error that led here
                log.debug("closing %s: %s", self.topic, exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    # ---- on the loop -----------------------------------------------------------------------

    async def _start(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
        from aiokafka.errors import KafkaConnectionError, KafkaError

        try:
            await self._ensure_topic()
            self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, client_id=self._client_id,
                                              acks="all", linger_ms=0)
            await self._producer.start()
            self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, client_id=self._client_id,
                                              group_id=None, enable_auto_commit=False,
                                              auto_offset_reset="earliest")
            await self._consumer.start()
            parts = self._consumer.partitions_for_topic(self.topic)
            for _ in range(50):
                if parts:
                    break
                await self._consumer._client.force_metadata_update()
                parts = self._consumer.partitions_for_topic(self.topic)
                await asyncio.sleep(0.1)
            if not parts:
                raise NotifyError(f"Kafka topic {self.topic} has no partitions", retryable=True)
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            self._consumer.assign(tps)
            await self._consumer.seek_to_beginning(*tps)
            await self._read_to(await self._consumer.end_offsets(tps))
            if self.follow:
                self._follow_task = asyncio.ensure_future(self._follow(tps))
        except KafkaConnectionError as exc:
            raise BrokerUnavailable(self.bootstrap, str(exc)) from None
        except KafkaError as exc:
            raise NotifyError(f"Kafka topic {self.topic}: {exc}", retryable=True) from None

    async def _read_to(self, end: dict[Any, int]) -> None:
        """Apply records until every partition's position reaches ``end`` (the follower's, when following)."""
        while True:
            behind = [tp for tp in end if await self._consumer.position(tp) < end[tp]]
            if not behind:
                return
            if self._follow_task is not None and not self._follow_task.done():
                await asyncio.sleep(0.02)  # the follower reads them: two readers of one consumer would race
            else:
                self._apply(await self._consumer.getmany(*behind, timeout_ms=500))

    async def _catch_up(self) -> None:
        from aiokafka.errors import KafkaConnectionError, KafkaError

        try:
            await self._read_to(await self._consumer.end_offsets(list(self._consumer.assignment())))
        except KafkaConnectionError as exc:
            raise BrokerUnavailable(self.bootstrap, str(exc)) from None
        except KafkaError as exc:
            raise NotifyError(f"Kafka topic {self.topic}: {exc}", retryable=True) from None

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=self._client_id)
        await admin.start()
        try:
            if self.topic in await admin.list_topics():
                return
            try:
                resp = await admin.create_topics([NewTopic(
                    name=self.topic, num_partitions=self._partitions, replication_factor=self._replication,
                    topic_configs={"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                                   "segment.ms": "3600000"})])
            except TopicAlreadyExistsError:
                return
            for item in getattr(resp, "topic_errors", ()) or ():
                code = item[1]
                if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (another process won the race)
                    raise NotifyError(f"cannot create Kafka topic {self.topic} (error code {code})", retryable=False)
        finally:
            await admin.close()

    def _apply(self, batch: dict[Any, list[Any]]) -> None:
        with self._lock:
            for records in batch.values():
                for r in records:
                    if r.key is None:
                        continue
                    key = r.key.decode("utf-8", "replace")
                    if r.value is None:
                        self._table.pop(key, None)
                        continue
                    try:
                        value = jsonl.loads(r.value)
                    except (UnicodeDecodeError, json.JSONDecodeError):
                        log.warning("%s: skipping a record that is not JSON (key %r, offset %s)",
                                    self.topic, key, r.offset)
                        continue
                    if isinstance(value, dict):
                        self._table[key] = value

    async def _follow(self, tps: list[Any]) -> None:
        while True:
            try:
                batch = await self._consumer.getmany(*tps, timeout_ms=500)
                self._apply(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep following through transient broker trouble
                log.warning("%s: reading failed (%s); retrying", self.topic, exc)
                await asyncio.sleep(1.0)

    async def _send(self, key: str, data: bytes | None) -> None:
        from aiokafka.errors import KafkaError

        try:
            await self._producer.send_and_wait(self.topic, key=key.encode(), value=data)
        except KafkaError as exc:
            raise NotifyError(f"cannot write to Kafka topic {self.topic}: {exc}", retryable=True) from None

    async def _stop(self) -> None:
        if self._follow_task is not None:
            self._follow_task.cancel()
            try:
                await self._follow_task
            except (asyncio.CancelledError, Exception):
                pass
        # The producer first, and each client on its own: aiokafka's consumer.stop() re-raises the cancellation of
        # its own pending fetch (aio-libs/aiokafka#647), a CancelledError that skipped the producer's stop.
        for client in (self._producer, self._consumer):
            if client is not None:
                try:
                    await client.stop()
                except (Exception, asyncio.CancelledError) as exc:
                    log.debug("stopping a Kafka client: %r", exc)
