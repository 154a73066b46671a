"""The node agent against the real Kafka broker (tests/conftest.py's ``kafka_bootstrap``)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import uuid
from typing import Any

import pytest
from whywait.agents.agent import Agent
from whywait.agents.collectors import HostCollector, NetworkCollector, StorageCollector
from whywait.agents.events import (
    TOPIC_AGENT_HEALTH,
    TOPIC_CHECKPOINTS,
    TOPIC_HOST,
    TOPIC_NET,
    TOPIC_STEPS,
    TOPIC_STORAGE,
    ContractError,
    decode,
    envelope,
)
from whywait.agents.publisher import KafkaPublisher
from whywait.agents.training import Reporter

pytestmark = pytest.mark.integration


async def consume(bootstrap: str, topics: list[str], node: str, want: dict[str, int],
                  timeout: float = 60.0) -> dict[str, list[dict[str, Any]]]:
    """The valid messages of ``node`` on ``topics`` until ``want`` counts are met (others' bad ones skipped).

    The agent's own messages are checked against the contract before they are sent (the publisher
    validates), so skipping invalid ones here only skips other tests' hostile input.
    """
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    got: dict[str, list[dict[str, Any]]] = {t: [] for t in topics}
    try:
        async with asyncio.timeout(timeout):
            while any(len(got[t]) < n for t, n in want.items()):
                for tp, batch in (await consumer.getmany(timeout_ms=500)).items():
                    for r in batch:
                        try:
                            msg = decode(r.value, tp.topic)
                        except ContractError:
                            continue  # another test's deliberately bad message on the shared topic
                        if msg["node"] == node:
                            got[tp.topic].append(dict(msg))
    finally:
        await consumer.stop()
    return got


async def test_agent_rounds_on_this_machine_reach_kafka(kafka_bootstrap: str, tmp_path: Any) -> None:
    node = f"it-agent-{uuid.uuid4().hex[:8]}"
    sock = os.path.join(str(tmp_path), "agent.sock")
    pub = KafkaPublisher(kafka_bootstrap, os.path.join(str(tmp_path), "spool"))
    collectors = [NetworkCollector("/", include_virtual=True), StorageCollector("/"), HostCollector("/")]
    agent = Agent(node, collectors, pub, interval=0.5, socket_path=sock)
    rep = Reporter("it-job", rank=0, sock=sock)

    async def train() -> None:
        await asyncio.sleep(0.3)
        for n in range(4):
            with rep.step(n):
                with rep.data_wait():
                    await asyncio.sleep(0.01)
        cid = rep.checkpoint_start("/ckpt/it")
        rep.checkpoint_end(4096, "/ckpt/it", checkpoint_id=cid)

    await asyncio.gather(agent.run(rounds=4), train())
    assert pub.invalid == 0 and pub.spooled == 0 and pub.sent >= 4 * 4
    topics = [TOPIC_NET, TOPIC_STORAGE, TOPIC_HOST, TOPIC_AGENT_HEALTH, TOPIC_STEPS, TOPIC_CHECKPOINTS]
    got = await consume(kafka_bootstrap, topics, node, {TOPIC_NET: 4, TOPIC_STORAGE: 4, TOPIC_HOST: 4,
                                                        TOPIC_AGENT_HEALTH: 4, TOPIC_STEPS: 1, TOPIC_CHECKPOINTS: 2})
    assert [len(got[t]) for t in (TOPIC_NET, TOPIC_STORAGE, TOPIC_HOST, TOPIC_AGENT_HEALTH)] == [4, 4, 4, 4]
    assert sorted(s["step"] for m in got[TOPIC_STEPS] for s in m["steps"]) == [0, 1, 2, 3]
    assert [m["phase"] for m in got[TOPIC_CHECKPOINTS]] == ["start", "end"]
    times = [m["time"] for m in got[TOPIC_HOST]]
    assert times == sorted(times)


def refused_port() -> socket.socket:
    """A socket bound but not listening: connecting is refused, and nothing else can take the port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def host_msg(node: str, i: int) -> dict[str, Any]:
    return envelope("host", node, 1_764_442_800.0 + i, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=i,
                    mem_total_bytes=1 << 30)


async def test_spooled_while_no_broker_then_everything_arrives_in_order(kafka_bootstrap: str, tmp_path: Any) -> None:
    node = f"it-spool-{uuid.uuid4().hex[:8]}"
    spool = os.path.join(str(tmp_path), "spool")
    held = refused_port()
    down = KafkaPublisher(f"127.0.0.1:{held.getsockname()[1]}", spool, request_timeout_ms=1000)
    for i in range(200):
        await down.send(TOPIC_HOST, node, host_msg(node, i))
    assert not await down.flush(timeout=1.0)
    assert down.spooled == 200 and down.sent == 0
    await down.close()
    held.close()

    up = KafkaPublisher(kafka_bootstrap, spool)  # the agent restarted, and the broker is back
    assert up.spooled == 200
    await up.start()
    assert await up.flush(timeout=60)
    for i in range(200, 210):
        await up.send(TOPIC_HOST, node, host_msg(node, i))
    assert await up.flush(timeout=30)
    assert up.spooled == 0 and up.sent == 210 and up.dropped_total == 0
    await up.close()
    got = await consume(kafka_bootstrap, [TOPIC_HOST], node, {TOPIC_HOST: 210})
    assert [m["mem_used_bytes"] for m in got[TOPIC_HOST]] == list(range(210))


def test_whywait_agent_command_publishes(kafka_bootstrap: str, tmp_path: Any) -> None:
    node = f"it-cli-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        [sys.executable, "-m", "whywait.agents.cli", "--node", node, "--interval", "0.5", "--rounds", "2",
         "--collectors", "host,storage", "--socket", "none", "--spool-dir", os.path.join(str(tmp_path), "spool")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap})
    assert proc.returncode == 0, proc.stderr
    got = asyncio.run(consume(kafka_bootstrap, [TOPIC_HOST, TOPIC_AGENT_HEALTH], node,
                              {TOPIC_HOST: 2, TOPIC_AGENT_HEALTH: 2}))
    assert len(got[TOPIC_HOST]) == 2 and got[TOPIC_AGENT_HEALTH][-1]["samples"] == 4


def test_two_agents_publishing_as_one_node_are_announced(kafka_bootstrap: str, tmp_path: Any) -> None:
    """A cloned machine: two real agent processes with one host name, through the broker, to the engine's
    record processor, which announces ``whywait.duplicate-node`` for that node (and only once)."""
    from aiokafka import AIOKafkaConsumer
    from whywait.engine.evaluate.evaluator import Evaluator
    from whywait.engine.rules.loader import RuleSet
    from whywait.engine.stream.processor import Processor, Record
    from whywait.engine.stream.topics import ensure_topics_async
    from whywait.topology.model import Topology

    asyncio.run(ensure_topics_async(kafka_bootstrap))  # as the engine does at start
    node = f"it-clone-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "whywait.agents.cli", "--node", node, "--interval", "0.5", "--rounds", "8",
         "--collectors", "host", "--socket", "none", "--spool-dir", os.path.join(str(tmp_path), f"spool{i}")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err

    async def health_records() -> list[Record]:
        consumer = AIOKafkaConsumer(TOPIC_AGENT_HEALTH, bootstrap_servers=kafka_bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
        await consumer.start()
        out: list[Record] = []
        try:
            async with asyncio.timeout(60):
                while len(out) < 16:
                    for tp, batch in (await consumer.getmany(timeout_ms=500)).items():
                        out += [Record(tp.topic, r.value, r.key, tp.partition, r.offset) for r in batch
                                if r.key == node.encode()]
        finally:
            await consumer.stop()
        return out

    records = asyncio.run(health_records())
    assert len({decode(r.value, TOPIC_AGENT_HEALTH)["instance"] for r in records if r.value}) == 2
    topo = Topology.from_dict({"format": 1, "name": "it", "nodes": [{"id": node, "gpus": 0}]})
    proc = Processor(Evaluator(RuleSet({}, ()), topo))
    diags = [d for r in records for d in proc.process([r]).diagnoses]
    assert [(d.rule_id, d.status, d.culprit) for d in diags] == [("whywait.duplicate-node", "firing", node)]


def test_agent_once_delivers_to_a_healthy_broker_and_exits_0(kafka_bootstrap: str, tmp_path: Any) -> None:
    # `agent --once` closed its publisher while it was still connecting: nothing sent, everything left in the
    # spool, exit 0 (a smoke test that always passed and never sent).
    node = f"it-once-{uuid.uuid4().hex[:8]}"
    spool = os.path.join(str(tmp_path), "spool")
    proc = subprocess.run(
        [sys.executable, "-m", "whywait.agents.cli", "--node", node, "--once", "--collectors", "host",
         "--socket", "none", "--spool-dir", spool, "--bootstrap", kafka_bootstrap],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not [n for n in os.listdir(spool) if n.endswith(".spool")]
    got = asyncio.run(consume(kafka_bootstrap, [TOPIC_HOST, TOPIC_AGENT_HEALTH], node, {TOPIC_AGENT_HEALTH: 1}))
    assert len(got[TOPIC_AGENT_HEALTH]) == 1


def test_agent_once_without_a_broker_says_what_is_left_and_exits_3(tmp_path: Any) -> None:
    held = refused_port()
    spool = os.path.join(str(tmp_path), "spool")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "whywait.agents.cli", "--node", "it-once-down", "--once", "--collectors", "host",
             "--socket", "none", "--spool-dir", spool, "--bootstrap", f"127.0.0.1:{held.getsockname()[1]}"],
            capture_output=True, text=True, timeout=120)
    finally:
        held.close()
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"whywait agent: 2 message(s) left in {spool}; the next run sends them"), proc.stderr
