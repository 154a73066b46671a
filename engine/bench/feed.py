"""A cluster's telemetry with one known fault, written once through the real broker.

Called by the harness once per cluster size (and for the sustained run).  Records are stamped
with their event time (so ``whywait replay`` seeks to them by time) and keyed as the contract
says; the offsets they got and the wall time each second of event time was sent are kept, so
every reader can be pointed at exactly this data and diagnoses can be timed from the event that
revealed them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

GPUS_PER_NODE = 8

TP = tuple[str, int]

# What the harness is given to make each cluster's data (``whywait bench`` passes the simulator's; the engine
# itself never imports ``simulate``): ``(nodes, start, seconds, topology path) -> (messages, Written)``.
Messages = Iterator[tuple[str, dict[str, Any]]]
MakeCluster = Callable[[int, float, float, Path], tuple[Messages, "Written"]]


@dataclass
class Written:
    """What one feed put on the topics: its event-time window, counts, offsets and send times."""

    nodes: int
    start: float
    seconds: float
    topology: Path
    fault: tuple[str, float, float]  # (node, event-time start, event-time end)
    first: dict[TP, int] = field(default_factory=dict)  # every input partition's end offset before the feed
    end: dict[TP, int] = field(default_factory=dict)  # ... and after it (exclusive)
    messages: int = 0
    bytes: int = 0
    sent_wall: dict[int, float] = field(default_factory=dict)  # whole event second -> wall time first sent
    feed_wall_s: float = 0.0

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def until(self) -> float:
        return self.start + self.seconds

    def sent_at(self, event_time: float) -> float | None:
        """Wall time the first message at or after ``event_time`` was sent (None past the feed)."""
        sec = int(event_time - self.start)
        for s in range(max(sec, 0), int(self.seconds) + 2):
            if s in self.sent_wall:
                return self.sent_wall[s]
        return None

    def partitions_with_data(self) -> list[TP]:
        return sorted(tp for tp, e in self.end.items() if e > self.first.get(tp, 0))


async def end_offsets(bootstrap: str) -> dict[TP, int]:
    """Every input partition's end offset now."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from whywait.agents.events import INPUT_TOPICS
    from whywait.engine.commands.replay_cmd import topic_partitions

    parts = await topic_partitions(bootstrap, list(INPUT_TOPICS))
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(t, p) for t in INPUT_TOPICS for p in parts.get(t, [0])]
        ends = await c.end_offsets(tps)
        return {(tp.topic, tp.partition): off for tp, off in ends.items()}
    finally:
        await c.stop()


async def write(bootstrap: str, messages: Iterator[tuple[str, dict[str, Any]]], w: Written,
                speed: float = 0.0) -> Written:
    """Publish ``messages`` (event-time order) and fill in ``w``; return it.

    ``speed`` paces the feed: that many seconds of event time per wall second (1 is real time, 0 as
    fast as the producer goes).  The producer is configured as the node agents' is (gzip, 50 ms linger).
    """
    from aiokafka import AIOKafkaProducer
    from whywait.agents.events import encode, message_key

    w.first = await end_offsets(bootstrap)
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip", linger_ms=50,
                         max_batch_size=1 << 20, max_request_size=8 << 20)
    await p.start()
    t0 = time.time()
    pending: list[Any] = []
    try:
        for topic, m in messages:
            t = float(m["time"])
            sec = int(t - w.start)
            if sec not in w.sent_wall:
                if speed > 0:  # pace: event second s goes out at t0 + s / speed
                    delay = t0 + max(sec, 0) / speed - time.time()
                    if delay > 0:
                        await asyncio.gather(*pending)
                        pending.clear()
                        await asyncio.sleep(delay)
                w.sent_wall[sec] = time.time()
            raw = encode(m)
            pending.append(await p.send(topic, raw, key=message_key(m), timestamp_ms=int(t * 1000)))
            w.messages += 1
            w.bytes += len(raw)
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await p.stop()
    w.feed_wall_s = time.time() - t0
    w.end = await end_offsets(bootstrap)
    return w
