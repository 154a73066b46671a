from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

import pytest
from whywait.agents.events import TOPIC_HOST, envelope
from whywait.agents.publisher import KafkaPublisher, MemoryPublisher, PrintPublisher, Spool

T0 = 1_764_442_800.0


def host_msg(i: int) -> dict[str, Any]:
    return envelope("host", "node-01", T0 + i, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=i,
                    mem_total_bytes=10**9)


class Broker:
    """What a fake producer talks to: up or down, and the values it acknowledged, in order."""

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.log: list[tuple[str, bytes, bytes]] = []
        self.producers = 0

    def values(self) -> list[int]:
        return [json.loads(v)["mem_used_bytes"] for _, _, v in self.log]


class FakeProducer:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def start(self) -> None:
        self.broker.producers += 1
        if not self.broker.up:
            raise ConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def send(self, topic: str, value: bytes, key: bytes) -> "asyncio.Future[None]":
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.broker.up:
            self.broker.log.append((topic, key, value))
            fut.set_result(None)
        else:
            fut.set_exception(ConnectionError("KafkaTimeoutError"))
        return fut

    async def stop(self) -> None:
        pass


def kafka(tmp_path: "os.PathLike[str]", broker: Broker, **kw: Any) -> KafkaPublisher:
    return KafkaPublisher("fake:9092", os.path.join(str(tmp_path), "spool"),
                          producer_factory=lambda: FakeProducer(broker), max_backoff_s=0.05, **kw)


async def test_memory_publisher_validates() -> None:
    p = MemoryPublisher()
    await p.send(TOPIC_HOST, "node-01", host_msg(1))
    await p.send(TOPIC_HOST, "node-01", {"schema": 1, "kind": "host", "time": T0, "node": "n"})
    await p.send("whywait.gpu.v1", "node-01", host_msg(2))  # right message, wrong topic
    assert len(p.messages) == 1 and p.invalid == 2 and p.of_kind("host")[0]["mem_used_bytes"] == 1


async def test_print_publisher_writes_json_lines() -> None:
    import io

    out = io.StringIO()
    p = PrintPublisher(out)
    await p.send(TOPIC_HOST, "node-01", host_msg(1))
    line = json.loads(out.getvalue())
    assert line["topic"] == TOPIC_HOST and line["kind"] == "host"


def test_spool_order_commit_and_restart(tmp_path: "os.PathLike[str]") -> None:
    d = str(tmp_path)
    s = Spool(d, max_bytes=1 << 20)
    for i in range(5):
        s.append("t", "k", f"v{i}".encode())
    assert len(s) == 5 and [r[2] for r in s.peek(2)] == [b"v0", b"v1"]
    s.commit(2)
    s.append("t", "k", b"v5")
    s.close()
    s2 = Spool(d, max_bytes=1 << 20)  # the agent restarted: what was not committed is still there
    got = []
    while len(s2):
        batch = s2.peek(10)
        got += [r[2] for r in batch]
        s2.commit(len(batch))
    assert got[-4:] == [b"v2", b"v3", b"v4", b"v5"]  # at least once: v0, v1 may come again after a restart
    assert os.listdir(d) == []


def test_spool_bound_drops_oldest_and_counts(tmp_path: "os.PathLike[str]") -> None:
    s = Spool(str(tmp_path), max_bytes=8192)
    for i in range(2000):
        s.append("t", "k", f"value-{i:05d}".encode())
    assert s.size_bytes <= 8192 and s.dropped > 0 and len(s) + s.dropped == 2000
    assert s.peek(1)[0][2] == f"value-{s.dropped:05d}".encode()  # the oldest kept follows the dropped


def test_spool_survives_a_torn_last_line(tmp_path: "os.PathLike[str]") -> None:
    d = str(tmp_path)
    s = Spool(d)
    s.append("t", "k", b"v0")
    s.close()
    with open(os.path.join(d, os.listdir(d)[0]), "ab") as fh:
        fh.write(b'["t","k","v1')  # the agent died mid-write
    assert len(Spool(d)) == 1


async def test_unreachable_broker_spools_then_delivers_in_order(tmp_path: "os.PathLike[str]") -> None:
    broker = Broker(up=False)
    p = kafka(tmp_path, broker)
    for i in range(50):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    await asyncio.sleep(0.1)
    assert p.spooled == 50 and p.sent == 0 and broker.log == []
    broker.up = True
    assert await p.flush(timeout=5)
    assert broker.values() == list(range(50)) and p.spooled == 0 and p.sent == 50
    for i in range(50, 60):  # connected now: straight through
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    assert await p.flush(timeout=5)
    assert broker.values() == list(range(60)) and broker.log[0][1] == b"node-01"
    await p.close()


async def test_reachable_again_is_said_after_an_outage_only(tmp_path: "os.PathLike[str]",
                                                           caplog: pytest.LogCaptureFixture) -> None:
    # Before the first connection every message goes through the spool: `whywait placement publish` logged
    # "reachable again; spool drained" on every run, against a broker that had never been down.
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "reachable again" in r.getMessage()]

    broker = Broker(up=True)
    p = kafka(tmp_path, broker)
    with caplog.at_level(logging.INFO, logger="whywait.publisher"):
        await p.send(TOPIC_HOST, "node-01", host_msg(0))
        assert await p.flush(timeout=5) and broker.values() == [0]
        assert said() == []
        broker.up = False
        await p._producer.stop()
        p._producer = None  # the connection is lost: the next connect fails while the broker is down
        for i in range(1, 5):
            await p.send(TOPIC_HOST, "node-01", host_msg(i))
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert p.spooled > 0
        broker.up = True
        assert await p.flush(timeout=5) and broker.values() == list(range(5))
        assert said() == ["Kafka at fake:9092 reachable again; spool drained"]
    await p.close()


async def test_broker_lost_midway_nothing_lost_order_kept(tmp_path: "os.PathLike[str]") -> None:
    broker = Broker(up=True)
    p = kafka(tmp_path, broker)
    for i in range(10):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    assert await p.flush(timeout=5)
    broker.up = False
    for i in range(10, 30):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
        await asyncio.sleep(0.005)
    assert p.spooled > 0
    broker.up = True
    for i in range(30, 40):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    assert await p.flush(timeout=5)
    assert broker.values() == list(range(40))
    await p.close()


async def test_spool_bound_past_a_long_outage(tmp_path: "os.PathLike[str]") -> None:
    broker = Broker(up=False)
    p = kafka(tmp_path, broker, spool_max_bytes=16384)
    for i in range(1000):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    assert p.dropped_total > 0 and p.spooled + p.dropped_total == 1000
    broker.up = True
    assert await p.flush(timeout=5)
    got = broker.values()
    assert got == list(range(1000 - len(got), 1000))  # the newest survive, in order
    await p.close()


async def test_spool_survives_an_agent_restart(tmp_path: "os.PathLike[str]") -> None:
    broker = Broker(up=False)
    p = kafka(tmp_path, broker)
    for i in range(20):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    await p.close()
    broker.up = True
    p2 = kafka(tmp_path, broker)
    assert p2.spooled == 20
    await p2.start()
    assert await p2.flush(timeout=5)
    assert broker.values() == list(range(20))
    await p2.close()


async def test_invalid_message_is_not_spooled(tmp_path: "os.PathLike[str]") -> None:
    p = kafka(tmp_path, Broker(up=False))
    await p.send(TOPIC_HOST, "node-01", {"kind": "host"})
    assert p.invalid == 1 and p.spooled == 0
    await p.close()


@pytest.mark.parametrize("real", [True])
async def test_real_aiokafka_producer_to_a_closed_port_spools(tmp_path: "os.PathLike[str]", real: bool) -> None:
    import socket

    # Keep the port bound but not listening: connections are refused, and no other process
    # (a broker or HTTP server started by another test) can take the port meanwhile.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        p = KafkaPublisher(f"127.0.0.1:{port}", os.path.join(str(tmp_path), "spool"), request_timeout_ms=1000)
        for i in range(5):
            await p.send(TOPIC_HOST, "node-01", host_msg(i))
        assert not await p.flush(timeout=1.5)
        assert p.spooled == 5 and p.sent == 0 and p.last_error
        await p.close()
    finally:
        s.close()


def test_a_field_refused_again_and_again_is_logged_once_a_minute(caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer that sends the same bad field every second writes one line a minute, with a count."""
    import whywait.agents.publisher as publisher

    clock = [1000.0]
    monkeypatch.setattr(publisher.time, "monotonic", lambda: clock[0])
    p = MemoryPublisher()
    bad = {"kind": "host", "node": "n1", "time": 1.7e9, "mem_used_bytes": -5}
    with caplog.at_level(logging.ERROR, logger=publisher.log.name):
        for _ in range(30):
            p.check("whywait.host.v1", dict(bad))
            clock[0] += 1.0
        assert len(caplog.records) == 1 and p.invalid == 30
        clock[0] += 60.0
        p.check("whywait.host.v1", dict(bad))
    assert len(caplog.records) == 2 and p.invalid == 31
    assert "(29 more like it since, not logged)" in caplog.records[1].getMessage()


def test_a_spool_another_process_drained_is_empty_not_a_loop(tmp_path: Any) -> None:
    # Two Slurm hooks opened one spool; the first delivered its segment and removed it.  The second's peek
    # answered [] while its count still said 1, and its publisher asked again, in a loop that never yielded.
    d = str(tmp_path)
    first = Spool(d, max_bytes=1 << 20)
    first.append("t", "k", b"v")
    first.close()
    a, b = Spool(d, max_bytes=1 << 20), Spool(d, max_bytes=1 << 20)
    assert len(a) == len(b) == 1
    a.commit(len(a.peek(10)))
    assert len(a) == 0 and not [n for n in os.listdir(d) if n.endswith(".spool")]
    assert b.peek(10) == [] and len(b) == 0  # forgotten, not asked for again
    b.append("t", "k2", b"w")  # and it still spools what it is given
    assert [r[1] for r in b.peek(10)] == ["k2"]


class SlowBroker(Broker):
    """A broker that takes ``connect_s`` to answer a new producer (aiokafka's bootstrap and metadata)."""

    def __init__(self, connect_s: float) -> None:
        super().__init__(up=True)
        self.connect_s = connect_s


class SlowProducer(FakeProducer):
    async def start(self) -> None:
        await asyncio.sleep(self.broker.connect_s)  # type: ignore[attr-defined]
        await super().start()


async def test_close_gives_a_broker_still_connecting_time_to_take_the_messages(tmp_path: Any) -> None:
    # `whywait agent --once` closed the publisher while it was still connecting: nothing was flushed, the
    # messages stayed in the spool, and the command exited 0 having sent nothing.
    broker = SlowBroker(0.3)
    p = KafkaPublisher("fake:9092", os.path.join(str(tmp_path), "spool"),
                       producer_factory=lambda: SlowProducer(broker), max_backoff_s=0.05)
    for i in range(3):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    await p.close(timeout=5.0)
    assert broker.values() == [0, 1, 2] and p.spooled == 0


async def test_close_against_a_broker_that_refuses_is_quick_and_keeps_the_spool(tmp_path: Any) -> None:
    broker = Broker(up=False)
    p = kafka(tmp_path, broker)
    for i in range(3):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    await asyncio.sleep(0.05)
    t0 = asyncio.get_running_loop().time()
    await p.close(timeout=5.0)
    assert asyncio.get_running_loop().time() - t0 < 1.0  # a stop during an outage is not slowed by the drain
    assert p.spooled == 3 and broker.log == []


async def test_a_spool_that_cannot_be_written_drops_counts_and_warns_once(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # A full /var or a read-only file system killed the agent (OSError from Spool.append up to the CLI).
    p = KafkaPublisher("fake:9092", os.path.join(str(tmp_path), "spool"), spool_flag="--spool-dir",
                       producer_factory=lambda: FakeProducer(Broker(up=False)), max_backoff_s=0.05)
    real_open = open

    def full_disk(path: Any, *a: Any, **kw: Any) -> Any:
        if str(path).endswith(".spool"):
            raise OSError(28, "No space left on device", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", full_disk)
    with caplog.at_level(logging.WARNING, logger="whywait.publisher"):
        for i in range(5):
            await p.send(TOPIC_HOST, "node-01", host_msg(i))
    said = [r.getMessage() for r in caplog.records if "cannot write the spool" in r.getMessage()]
    assert p.dropped_total == 5 and p.spooled == 0
    assert len(said) == 1 and p.spool.dir in said[0] and "--spool-dir" in said[0] and "No space left" in said[0]
    monkeypatch.setattr("builtins.open", real_open)  # the disk has room again: spooling goes on
    await p.send(TOPIC_HOST, "node-01", host_msg(5))
    assert p.spooled == 1
    await p.close(timeout=0.1)


def test_a_failed_spool_write_leaves_the_spool_consistent(tmp_path: Any) -> None:
    s = Spool(str(tmp_path), max_bytes=1 << 20)
    s.append("t", "k", b"v0")

    class Torn:
        def write(self, data: bytes) -> int:
            raise OSError(28, "No space left on device")

        def flush(self) -> None:
            pass

        def close(self) -> None:
            pass

    s._fh = Torn()  # type: ignore[assignment]
    with pytest.raises(OSError):
        s.append("t", "k", b"v1")
    s.append("t", "k", b"v2")
    got = []
    while len(s):
        batch = s.peek(10)
        got += [r[2] for r in batch]
        s.commit(len(batch))
    assert got == [b"v0", b"v2"]


def test_spool_drop_warnings_are_said_once_a_minute_with_the_total_and_the_flag(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import whywait.agents.publisher as publisher

    clock = [1000.0]
    monkeypatch.setattr(publisher.time, "monotonic", lambda: clock[0])
    s = Spool(str(tmp_path), max_bytes=5242, bound_flag="--spool-max-mb")
    with caplog.at_level(logging.WARNING, logger="whywait.publisher"):
        for i in range(2000):
            s.append("t", "k", f"value-{i:05d}".encode())
            clock[0] += 0.01
        assert s.dropped > 100 and len(caplog.records) == 1
        clock[0] += 60
        s.append("t", "k", b"x" * 2000)
    assert len(caplog.records) == 2
    text = caplog.records[1].getMessage()
    assert "5.12 KiB (--spool-max-mb)" in text and "since the last warning" in text and "in all since start" in text


async def test_the_outage_warning_says_why_and_repeats_every_minute(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import whywait.agents.publisher as publisher

    p = kafka(tmp_path, Broker(up=False))
    clock = [1000.0]
    monkeypatch.setattr(publisher.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="whywait.publisher"):
        p._note_down(f"not acknowledged: {publisher.reason(asyncio.TimeoutError())}")
        clock[0] += 30
        p._note_down("cannot connect: ConnectionError: refused")
        clock[0] += 31
        p._note_down("cannot connect: ConnectionError: refused")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and not said[0].endswith(": ") and "TimeoutError: " in said[0]
    assert "still unreachable after 61 s" in said[1]
    await p.close(timeout=0.1)


class HoldingBroker(Broker):
    """Like aiokafka: a producer keeps the batches the broker did not acknowledge and delivers them once
    it reconnects, unless they were failed."""

    def __init__(self) -> None:
        super().__init__(up=True)
        self.held: list[tuple[asyncio.Future[None], tuple[str, bytes, bytes]]] = []

    def come_back(self) -> None:
        self.up = True
        for fut, rec in self.held:
            if not fut.done():
                self.log.append(rec)
                fut.set_result(None)
        self.held = []


class HoldingProducer(FakeProducer):
    class _Sender:
        async def close(self) -> None:
            pass

    class _Accumulator:
        def __init__(self, broker: HoldingBroker) -> None:
            self.broker = broker

        def fail_all(self, exc: BaseException) -> None:
            for fut, _ in self.broker.held:
                if not fut.done():
                    fut.set_exception(exc)

    def __init__(self, broker: HoldingBroker) -> None:
        super().__init__(broker)
        self._sender = self._Sender()
        self._message_accumulator = self._Accumulator(broker)

    async def send(self, topic: str, value: bytes, key: bytes) -> "asyncio.Future[None]":
        if self.broker.up:
            return await super().send(topic, value, key)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.broker.held.append((fut, (topic, key, value)))  # type: ignore[attr-defined]
        return fut


async def test_what_the_producer_held_when_the_broker_went_away_arrives_once(tmp_path: Any) -> None:
    # Finding 7: the unacknowledged messages were spooled while aiokafka still held them; both sent them.
    broker = HoldingBroker()
    p = KafkaPublisher("fake:9092", os.path.join(str(tmp_path), "spool"), request_timeout_ms=10,
                       producer_factory=lambda: HoldingProducer(broker), max_backoff_s=0.05)
    p.request_timeout_ms = -4990  # the acknowledgement wait (timeout + 5 s) is 10 ms
    await p.send(TOPIC_HOST, "node-01", host_msg(0))
    assert await p.flush(timeout=5)
    broker.up = False
    for i in range(1, 4):
        await p.send(TOPIC_HOST, "node-01", host_msg(i))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if p.spooled == 3:
            break
    assert p.spooled == 3
    broker.come_back()
    assert await p.flush(timeout=5)
    assert broker.values() == [0, 1, 2, 3]  # each once, in order
    await p.close()
