"""The real Kafka 4.1 broker (tests/conftest.py) with the clients whywait uses: aiokafka and faust."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from whywait.engine.errors import BrokerUnavailable
from whywait.engine.localkafka import broker as lb

pytestmark = pytest.mark.integration


async def _consume(bootstrap: str, topic: str, n: int, *, group: str | None = None, timeout: float = 30.0):
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    records = []
    try:
        async with asyncio.timeout(timeout):
            while len(records) < n:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
        committed = {}
        if group is not None:
            await consumer.commit()
            committed = {tp.partition: await consumer.committed(tp) for tp in consumer.assignment()}
    finally:
        await consumer.stop()
    return records, committed


async def test_round_trip_idempotent_acks_all_gzip_and_group_commit(kafka_bootstrap, kafka_topic_factory):
    from aiokafka import AIOKafkaProducer

    topic = await kafka_topic_factory(partitions=3)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True,
                                compression_type="gzip")
    await producer.start()
    try:
        for i in range(30):
            await producer.send(topic, f"v{i}".encode(), key=f"k{i % 5}".encode())
        await producer.flush()
    finally:
        await producer.stop()

    group = f"g-{uuid.uuid4().hex[:8]}"
    records, committed = await _consume(kafka_bootstrap, topic, 30, group=group)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(30))
    assert sum(committed.values()) == 30  # the group's committed offsets cover every record
    by_key: dict[bytes, list[int]] = {}
    for r in records:
        by_key.setdefault(r.key, []).append(r.partition)
    assert all(len(set(parts)) == 1 for parts in by_key.values())  # same key, same partition

    # A second consumer in the same group starts after the commit: nothing left to read.
    from aiokafka import AIOKafkaConsumer

    again = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    await again.start()
    try:
        assert not await again.getmany(timeout_ms=1500)
    finally:
        await again.stop()


async def _topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    return {entry[0]: entry[1] for entry in response.resources[0][4]}


async def test_compacted_topic(kafka_bootstrap, kafka_topic_factory):
    from aiokafka import AIOKafkaProducer

    topic = await kafka_topic_factory(compacted=True)
    assert (await _topic_config(kafka_bootstrap, topic))["cleanup.policy"] == "compact"

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"first", key=b"node-1")
        await producer.send_and_wait(topic, b"second", key=b"node-1")
        await producer.send_and_wait(topic, None, key=b"node-2")  # a tombstone is legal on a compacted topic
    finally:
        await producer.stop()
    records, _ = await _consume(kafka_bootstrap, topic, 3)
    assert [(r.key, r.value) for r in records] == [(b"node-1", b"first"), (b"node-1", b"second"), (b"node-2", None)]


async def test_faust_agent_consumes_and_produces(kafka_bootstrap, kafka_topic_factory, tmp_path):
    """faust 0.15 + aiokafka 0.14 against Kafka 4.1: topic declaration, group join, commit, changelog."""
    import faust
    from aiokafka import AIOKafkaProducer

    suffix = uuid.uuid4().hex[:8]
    # Source topics must exist when the worker subscribes: faust declares only its internal topics.
    source = await kafka_topic_factory(name=f"faust-in-{suffix}")
    app = faust.App(f"whywait-test-{suffix}", broker=f"kafka://{kafka_bootstrap}", store="memory://",
                    topic_replication_factor=1, topic_partitions=1, web_enabled=False,
                    key_serializer="raw", value_serializer="raw",
                    datadir=str(tmp_path / "faust"))  # faust's default is ./<id>-data in the cwd
    src = app.topic(source)
    dst = app.topic(f"faust-out-{suffix}", internal=True, partitions=1)  # declared by faust itself
    counts = app.Table(f"counts-{suffix}", default=int, partitions=1)

    @app.agent(src)
    async def relay(stream):
        async for key, value in stream.items():
            counts[key] += 1
            await dst.send(key=key, value=value.upper())

    await app.start()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait(source, f"hello{i}".encode(), key=b"gpu-0")
        finally:
            await producer.stop()
        records, _ = await _consume(kafka_bootstrap, dst.get_topic_name(), 3, timeout=60)
        assert [r.value for r in records] == [b"HELLO0", b"HELLO1", b"HELLO2"]
        assert counts[b"gpu-0"] == 3
        # faust created the table's changelog itself (its CreateTopics, with configs): compacted.
        assert (await _topic_config(kafka_bootstrap, counts.changelog_topic.get_topic_name()))[
            "cleanup.policy"] == "compact"
    finally:
        await app.stop()


def test_resolve_bootstrap_prefers_the_environment(kafka_bootstrap, monkeypatch):
    monkeypatch.setenv(lb.BOOTSTRAP_ENV, kafka_bootstrap)
    assert lb.resolve_bootstrap() == kafka_bootstrap
    assert lb.ensure_broker() == kafka_bootstrap
    assert lb.probe(kafka_bootstrap)


def test_resolve_bootstrap_without_env_reads_the_state_file(kafka_bootstrap, monkeypatch, tmp_path):
    """A state file naming a live broker process and its port resolves to it (what `whywait kafka start` writes)."""
    monkeypatch.delenv(lb.BOOTSTRAP_ENV, raising=False)
    port = int(kafka_bootstrap.rsplit(":", 1)[1])
    pid = _broker_pid(port)
    if pid is None:
        pytest.skip("the session broker is not a local kafka.Kafka process (external WHYWAIT_KAFKA_BOOTSTRAP)")
    lb.write_state({"pid": pid, "port": port}, tmp_path)
    assert lb.resolve_bootstrap(tmp_path) == f"127.0.0.1:{port}"


def test_broker_not_running_is_a_one_line_broker_unavailable(monkeypatch, tmp_path):
    monkeypatch.delenv(lb.BOOTSTRAP_ENV, raising=False)
    with pytest.raises(BrokerUnavailable) as no_state:
        lb.resolve_bootstrap(tmp_path)
    # A state file left behind by a broker that died: stale, removed, same error.
    dead = subprocess.Popen(["true"])
    dead.wait()
    lb.write_state({"pid": dead.pid, "port": lb.free_port()}, tmp_path)
    with pytest.raises(BrokerUnavailable) as stale:
        lb.resolve_bootstrap(tmp_path)
    assert not lb.state_file(tmp_path).exists()
    for exc in (no_state.value, stale.value):
        assert "\n" not in str(exc) and "whywait kafka start" in str(exc)
    assert not lb.probe(f"127.0.0.1:{lb.free_port()}")


def test_cli_start_status_stop_detached(kafka_bootstrap, tmp_path):
    """`whywait kafka start` detaches a second broker that survives the command; status and stop find it."""
    if not lb.jars_fetched():
        pytest.skip("jars not in the default cache")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"kafka-{lb.KAFKA_VERSION}").symlink_to(lb.libs_dir().parent)  # share the fetched jars
    env = {k: v for k, v in os.environ.items() if k != lb.BOOTSTRAP_ENV} | {lb.CACHE_ENV: str(cache)}

    def whywait(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "whywait", "kafka", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    started = whywait("start")
    assert started.returncode == 0, started.stderr
    line = started.stdout.strip().splitlines()[-1]
    assert line.startswith(f"{lb.BOOTSTRAP_ENV}=127.0.0.1:")
    bootstrap = line.split("=", 1)[1]
    try:
        assert lb.probe(bootstrap)
        assert whywait("start").stdout.strip().endswith(bootstrap)  # already running: same broker
        status = whywait("status")
        assert status.returncode == 0 and bootstrap in status.stdout
        assert (Path(lb.read_state(cache)["data_dir"]) / "kafka-server.log").exists()
    finally:
        stopped = whywait("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not lb.state_file(cache).exists()
    assert whywait("status").returncode == 1
    assert not lb.probe(bootstrap)


def _broker_pid(port: int) -> int | None:
    """The pid of the local kafka.Kafka process whose server.properties listens on ``port``."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" not in cmdline:
            continue
        props = Path(cmdline[-2].decode() if cmdline[-1] == b"" else cmdline[-1].decode())
        try:
            if f"PLAINTEXT://127.0.0.1:{port}," in props.read_text():
                return int(proc.name)
        except OSError:
            continue
    return None
