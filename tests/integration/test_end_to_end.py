"""End to end through the real parts: simulator → Kafka 4 → faust engine → rule → slack_sdk → Slack server.

One module-scoped run (the expensive part: two real processes and a broker) is
shared by the assertions below.  The simulator runs as fast as it can; the fault
(node-07's NIC dropping packets) starts 120 s of event time into the run, after a
fault-free lead-in during which nothing may be posted.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.events import TOPIC_DEADLETTER, TOPIC_DIAGNOSES, TOPIC_NET, TOPIC_STEPS

from tests.support.slack_server import SlackServer
from tests.support.workers import private_broker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FAULT_START, FAULT_END, DURATION = 120, 260, 300


def whywait(*args: str) -> list[str]:
    return [sys.executable, "-m", "whywait", *args]


async def consume(bootstrap: str, topic: str, until: float, want: int = 1,
                  match: Any = lambda d: True) -> list[dict[str, Any]]:
    """Read ``topic`` from the start until ``want`` JSON values match or ``until`` passes."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await c.start()
    out: list[dict[str, Any]] = []
    try:
        while time.time() < until and len(out) < want:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                out += [d for d in (json.loads(m.value) for m in msgs) if match(d)]
        return out
    finally:
        await c.stop()


async def produce_raw(bootstrap: str, items: list[tuple[str, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        for topic, value in items:
            await p.send_and_wait(topic, value, key=b"bad")
    finally:
        await p.stop()


@dataclass
class Run:
    bootstrap: str
    slack: SlackServer
    start: float
    truth: list[dict[str, Any]]
    diagnoses: list[dict[str, Any]]
    dead: list[dict[str, Any]]
    engine_log: str


# The module's own broker.  The engine reads each input topic from its start (not --latest: the malformed input and
# the simulation are produced without waiting for it to be consuming), and the diagnoses and dead letters are read
# from their start too: on the suite's shared broker that was everything every earlier test had left there.
broker = private_broker


@pytest.fixture(scope="module")
def run(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster

    kafka_bootstrap = broker
    work = tmp_path_factory.mktemp("e2e")
    ensure_topics(kafka_bootstrap)
    topo = work / "topology.yaml"
    make_cluster(nodes=16).to_yaml(topo)
    start = float(int(time.time()) + 86_400 * 30)  # a month ahead: no other test's events overlap
    with SlackServer(channels=["#ml-platform", "#whywait"], token="xoxb-e2e") as slack:
        env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "SLACK_BOT_TOKEN": "xoxb-e2e",
               "WHYWAIT_SLACK_API_URL": slack.url, "PYTHONUNBUFFERED": "1",
               "WHYWAIT_NOTIFY_OUTBOX": str(work / "outbox")}
        log = (work / "engine.log").open("w")
        engine = subprocess.Popen(whywait("engine", "--topology", str(topo), "--group", f"e2e-{start:.0f}",
                                          "--not-before", str(start), "--no-restore",
                                          "--max-clock-skew", "off"),  # a month ahead
                                  stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            # Malformed input first: the engine must dead-letter it and keep going.
            asyncio.run(produce_raw(kafka_bootstrap, [
                (TOPIC_NET, b"{not json"),
                (TOPIC_STEPS, json.dumps({"schema": 1, "kind": "steps", "time": start, "node": "node-01",
                                          "job": "train-llm", "steps": [{"rank": 0}]}).encode()),
            ]))
            truth_file = work / "truth.json"
            subprocess.run(whywait("simulate", "--nodes", "16", "--duration", str(DURATION), "--speed", "0",
                                   "--fault", f"nic-packet-loss:node-07@{FAULT_START}-{FAULT_END}",
                                   "--start-time", str(start), "--truth-out", str(truth_file)),
                           env=env, cwd=REPO, check=True, timeout=180)
            until = time.time() + 90
            diags = asyncio.run(consume(kafka_bootstrap, TOPIC_DIAGNOSES, until, want=2,
                                        match=lambda d: d.get("detected_at", 0) >= start))
            dead = asyncio.run(consume(kafka_bootstrap, TOPIC_DEADLETTER, time.time() + 20, want=2,
                                       match=lambda d: d.get("key") == "bad"))
            deadline = time.time() + 30
            while time.time() < deadline and not any("RESOLVED" in m.all_text.upper()
                                                     for m in slack.roots("#ml-platform")):
                time.sleep(0.2)
            truth = json.loads(truth_file.read_text())
        finally:
            engine.terminate()
            engine.wait(30)
            log.close()
        yield Run(kafka_bootstrap, slack, start, truth if isinstance(truth, list) else truth["faults"],
                  diags, dead, (work / "engine.log").read_text())


def test_diagnosis_names_job_rank_node_cause_and_owner(run: Run) -> None:
    firing = [d for d in run.diagnoses if d["status"] == "firing"]
    assert firing, run.engine_log[-3000:]
    d = firing[0]
    assert d["rule_id"] == "network.straggler-retransmits"
    assert d["job"] == "train-llm" and d["culprit"] == "node-07"
    assert d["owner"] == {"project": "llm", "team": "ml-platform", "channel": "#ml-platform"}
    assert set(d["ranks"]) == {48, 49, 50, 51, 52, 53, 54, 55}
    assert "leaf-02" in d["topology_path"]


def test_slack_message_posted_to_owning_team_channel(run: Run) -> None:
    posts = run.slack.posts("#ml-platform")
    roots = [p for p in posts if not p.thread_ts]
    assert len(roots) == 1, ([p.text for p in posts], run.engine_log[-3000:])
    msg = run.slack.roots("#ml-platform")[0].all_text
    for needle in ("train-llm", "node-07", "48–55", "drops", "packets/s", "retransmit", "llm", "ml-platform",
                   "leaf-02"):
        assert needle in msg, needle
    assert run.slack.posts("#whywait") == []  # routed to the owner, not the default channel


def test_nothing_during_fault_free_lead_in(run: Run) -> None:
    fault_start = run.start + FAULT_START
    assert all(d["detected_at"] >= fault_start for d in run.diagnoses)
    first = min(d["detected_at"] for d in run.diagnoses if d["status"] == "firing")
    seen = [(d["rule_id"], d["status"], d["culprit"], d["detected_at"] - fault_start) for d in run.diagnoses]
    assert first - fault_start <= 15, f"detection latency above 15 s of event time: {seen}"


def test_root_message_ends_resolved(run: Run) -> None:
    # Usually the root is edited when the resolution comes.  The simulator runs flat out, so the
    # 140-s fault can also fire and resolve within one wall-clock second: then the incident is
    # posted once, already resolved (the notifier's backlog rule), and never edited.  Either way
    # the one root message ends up saying RESOLVED, with the resolution in its thread.
    assert any(d["status"] == "resolved" for d in run.diagnoses)
    roots = run.slack.roots("#ml-platform")
    assert len(roots) == 1 and "RESOLVED" in roots[0].all_text.upper(), run.engine_log[-3000:]
    assert any("resolved at" in r.text for r in run.slack.thread(roots[0].ts))
    updates = run.slack.calls_to("chat.update")
    assert all(u.ts == roots[0].ts for u in updates)  # edits go to that root, never a second post


def test_malformed_messages_are_dead_lettered_with_reasons(run: Run) -> None:
    reasons = sorted(d["reason"] for d in run.dead)
    assert len(reasons) == 2
    assert reasons[0].startswith("not valid JSON")
    assert "steps[0].step: is required" in reasons[1]


def test_unreachable_broker_is_one_line(tmp_path: Path) -> None:
    from whywait.simulate.cluster import make_cluster

    topo = tmp_path / "t.yaml"
    make_cluster(nodes=4).to_yaml(topo)
    r = subprocess.run(whywait("engine", "--bootstrap", "127.0.0.1:1", "--topology", str(topo)),
                       capture_output=True, text=True, cwd=REPO, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("SLACK")})
    assert r.returncode == 3  # unavailable (2 is a wrong flag or file)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Kafka at 127.0.0.1:1 is unreachable" in lines[0], r.stderr


def test_bad_rule_file_stops_engine_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "network.bad.yaml"
    bad.write_text("apiVersion: whywait/v1\nid: network.bad\ntitle: t\ncause: c\nnext_step: n\n"
                   "when:\n  type: threshold\n  metric: net.tcp_retrans_segs_per_s\n  value: 5\n")
    r = subprocess.run(whywait("engine", "--rules", str(bad), "--bootstrap", "127.0.0.1:1"),
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2
    assert f"{bad}:9: rule 'network.bad': 'when.value' must be a comparison like '> 10' (got 5)" in r.stderr
