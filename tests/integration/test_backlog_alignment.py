"""A backlog read through the real broker: the engine reads its inputs aligned in event time.

The telemetry of 16 nodes x 420 s is written before the engine starts, each record stamped with its
event time (as an agent's send time stamps it live).  In 1 MB fetches the host topic (small
messages) covers minutes per fetch and the steps topic seconds, so without alignment host and
storage ran hundreds of seconds ahead and the store held all of it (engine/stream/alignment.py).
The engine must pause the partitions that run ahead, still diagnose the fault at its time, and say
nothing during the lead-in.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.events import TOPIC_DIAGNOSES, encode, message_key

from tests.support.workers import private_broker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FAULT_START, FAULT_END, DURATION = 150, 330, 420

# The module's own broker.  The engine reads the backlog from each partition's start and the diagnoses are read from
# theirs: on the suite's shared broker that was also everything every earlier test had left there.
broker = private_broker


async def _produce(bootstrap: str, msgs: list[tuple[str, dict[str, Any]]], shift_s: float) -> None:
    """Write ``msgs`` stamped with their event time less ``shift_s`` (the broker refuses stamps far ahead of
    its clock, and the events lie weeks ahead so that no other test's overlap them: only differences matter)."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=1 << 20)
    await p.start()
    try:
        pending = []
        for topic, m in msgs:
            stamp = int((float(m["time"]) - shift_s) * 1000)
            pending.append(await p.send(topic, encode(m), key=message_key(m), timestamp_ms=stamp))
        await asyncio.gather(*pending)
    finally:
        await p.stop()


async def _diagnoses(bootstrap: str, start: float, until: float) -> list[dict[str, Any]]:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(TOPIC_DIAGNOSES, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await c.start()
    out: list[dict[str, Any]] = []
    try:
        while time.time() < until:
            for recs in (await c.getmany(timeout_ms=500)).values():
                out += [d for d in (json.loads(r.value) for r in recs) if d.get("detected_at", 0) >= start]
            if any(d.get("rule_id") == "network.straggler-retransmits" and d.get("status") == "resolved" for d in out):
                break
        return out
    finally:
        await c.stop()


def test_a_backlog_is_read_aligned_and_diagnosed_at_its_event_times(broker: str, tmp_path: Path) -> None:
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster, make_job
    from whywait.simulate.faults import make_fault
    from whywait.simulate.sim import Simulation

    kafka_bootstrap = broker
    ensure_topics(kafka_bootstrap)
    topo = make_cluster(nodes=16)
    topo.to_yaml(tmp_path / "topology.yaml")
    # Its own stretch of event time: after the events of the tests that run before it (the bench's two days
    # back, the agents' now), before those of the tests that run after it and read the topics from their
    # start with --not-before (test_receivers 25 days ahead, test_end_to_end 30, ...).
    shift = 86_400 * 20
    start = float(int(time.time()) + shift)
    sim = Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", "node-05", FAULT_START, FAULT_END)],
                     start_time=start, duration_s=DURATION, seed=11)
    asyncio.run(_produce(kafka_bootstrap, list(sim.messages()), shift + DURATION + 60))

    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONUNBUFFERED": "1",
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox")}
    env.pop("SLACK_BOT_TOKEN", None)
    log_path = tmp_path / "engine.log"
    with log_path.open("w") as log:
        engine = subprocess.Popen(
            [sys.executable, "-m", "whywait", "engine", "--topology", str(tmp_path / "topology.yaml"),
             "--group", f"align-{start:.0f}", "--not-before", str(start), "--no-restore", "--max-clock-skew", "off",
             "--align", "30"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            diags = asyncio.run(_diagnoses(kafka_bootstrap, start, time.time() + 150))
        finally:
            engine.terminate()
            engine.wait(30)
    text = log_path.read_text()
    paused = re.findall(r"engine: pausing (.*?): read more than 30s ahead of (\S+)", text)
    assert paused, f"no partition was paused on a backlog; engine log tail:\n{text[-3000:]}"
    assert any("whywait.host.v1" in names for names, _ in paused)  # the small-message topic ran ahead
    assert "Traceback" not in text
    net = [d for d in diags if d.get("rule_id") == "network.straggler-retransmits"]
    assert net, f"the fault was not diagnosed from the backlog: {[d.get('rule_id') for d in diags]}"
    firing = min(d["starts_at"] for d in net)
    assert start + FAULT_START - 5 <= firing <= start + FAULT_START + 30
    assert not [d for d in diags if d["starts_at"] < start + FAULT_START - 5], "a diagnosis during the lead-in"
