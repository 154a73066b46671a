"""Replay reads every partition from where it chose, even when aiokafka's own start-up reset answers late.

Seen in ``whywait bench`` (about one run in three at 32 GPUs): a replay read one message fewer than were written,
and it was the job's placement, so the replay found no incident.  The cause: on ``assign`` aiokafka resets every
new partition in the background with ``auto_offset_reset`` ("latest" by default); the reader then asked for the
placement partition's start with ``seek_to_beginning``, which only requests another reset, and when the
background "latest" answer came back after that request aiokafka applied it to it.  The partition was positioned
at its end and closed unread.  Here that answer is made late on purpose (the client's own reset requests to the
real broker are held back 2 s), so the old reader loses the placement every time.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from typing import Any

import pytest
from whywait.agents.events import TOPIC_PLACEMENT, decode, encode, message_key

pytestmark = pytest.mark.integration

# Event time of this test's data: its own stretch, after every other integration test's (+25..+55 days).  It is
# kept to a few messages per topic: another test's replay reading a whole partition stops at 16 in a row past its
# window (whywait.engine.replay._PAST_RUN), and these lie past every other window.  Like
# test_replay_project_kafka's (+50 days), they are ahead of the live engine in tests/integration/test_replay_kafka.py:
# the suite runs tests/integration first; a selection of both must too (`pytest tests/integration tests/replay`).
OFFSET_S = 86_400 * 60
HOLD_S = 2.0

_IN_RESET: contextvars.ContextVar[bool] = contextvars.ContextVar("in_background_reset", default=False)


def hold_back_background_resets(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Make aiokafka's own start-up reset answer late, after the reader has chosen where to start; return its log.

    The fetcher resets new partitions by itself in a task of its own (``Fetcher._update_fetch_positions``): its
    ListOffsets requests are held back ``HOLD_S``.  The reader's own look-ups (``end_offsets``,
    ``offsets_for_times``, ``beginning_offsets``) wait until that reset has been sent (up to 10 s), so it is
    always in flight, and answered late, whatever the machine's timing.
    """
    from aiokafka.consumer.fetcher import Fetcher

    for name in ("_update_fetch_positions", "_proc_offset_request"):
        assert hasattr(Fetcher, name), f"aiokafka changed: Fetcher.{name} is gone, this test no longer forces the race"
    held: list[dict[str, Any]] = []
    sent = threading.Event()  # the reader runs its own event loop on a thread of its own
    update, request = Fetcher._update_fetch_positions, Fetcher._proc_offset_request

    async def slow_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        _IN_RESET.set(True)  # the reset task's own context: only the requests it makes see it
        return await update(self, *args, **kwargs)

    async def slow_request(self: Any, node_id: Any, topic_data: Any) -> Any:
        if _IN_RESET.get():
            held.append(dict(topic_data))
            fut = asyncio.ensure_future(request(self, node_id, topic_data))  # sent now ...
            sent.set()
            await asyncio.sleep(HOLD_S)  # ... its answer seen late
            return await fut
        deadline = time.monotonic() + 10
        while not sent.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return await request(self, node_id, topic_data)

    monkeypatch.setattr(Fetcher, "_update_fetch_positions", slow_update)
    monkeypatch.setattr(Fetcher, "_proc_offset_request", slow_request)
    return held


async def produce(bootstrap: str, items: list[tuple[str, dict[str, Any], int | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        for topic, m, partition in items:
            await p.send_and_wait(topic, encode(m), key=message_key(m), partition=partition)
    finally:
        await p.stop()


def canon(m: Any) -> str:
    """One message (a dict or a decoded event) as sorted JSON, to compare what was written with what came out."""
    return json.dumps(json.loads(encode(m)), sort_keys=True)


def test_a_late_background_reset_does_not_move_a_partition_to_its_end(kafka_bootstrap: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from whywait.engine.commands.replay_cmd import kafka_batches
    from whywait.engine.replay import EventTimeMerge, Window
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster, make_job
    from whywait.simulate.sim import Simulation

    ensure_topics(kafka_bootstrap)
    start = float(int(time.time()) + OFFSET_S)
    topo = make_cluster(nodes=2)
    job = f"reset-race-{start:.0f}"
    sim = Simulation(topo, [make_job(topo, job=job, project="race", team="t", channel=None)], start_time=start,
                     duration_s=3, seed=3)
    msgs = list(sim.messages())
    (placement,) = [m for t, m in msgs if t == TOPIC_PLACEMENT]
    assert placement["time"] == start  # the window's first instant: it stands in for the job at the start
    # The placement goes to partition 0 of its topic: the first partition the reader positions, the one the
    # late "latest" answer used to land on.  The rest is partitioned by its contract key.
    asyncio.run(produce(kafka_bootstrap, [(t, m, 0 if t == TOPIC_PLACEMENT else None) for t, m in msgs]))
    held = hold_back_background_resets(monkeypatch)

    window = Window(start, start + 10)
    merge = EventTimeMerge([], window)
    got = list(kafka_batches(kafka_bootstrap, window, merge))

    assert any(TOPIC_PLACEMENT in data and any(p == 0 for p, _ in data[TOPIC_PLACEMENT]) for data in held), held
    written = [canon(decode(encode(m), t)) for t, m in msgs]
    released = [canon(m) for m in got]
    missing = sorted(set(written) - set(released))
    assert not missing, f"{len(missing)} of {len(written)} written messages not replayed, first: {missing[0][:200]}"
    assert any(m["kind"] == "placement" and m["job"] == job for m in got)
    # Nothing else lies in this stretch of event time: every released message but other jobs' standing
    # placements (stamped at the window's start) is one this test wrote, once.
    ours = [canon(m) for m in got if m["kind"] != "placement" or m["job"] == job]
    assert sorted(ours) == sorted(written)
    assert sum(1 for m in got if m["kind"] == "host") > 0
