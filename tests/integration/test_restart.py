"""A restarted engine resumes its incidents: no false resolve, no second root, no blind spot, no long pause.

Engine A sees a fault begin and posts; in the middle of the fault it is killed (``kill -9``) or stopped
(SIGTERM); engine B (same consumer group)
restores the checkpointed evaluator state and the notifier's message map from their compacted topics
and must:

* start consuming within 10 s (static group membership: no wait for the dead member's session);
* keep the incident open until the fault really ends: its resolution comes only after the fault's
  end, within the rule's ``keep_firing_for`` plus the evaluation lateness (the observed bug: the
  restarted engine, its windows empty, resolved the incident at once);
* edit the message A posted, never post a second root for it;
* announce a new fault on another node of the same job after the restart (the observed bug: the
  restarted engine never re-read the job's placement, and went blind on the job).

Event times are in the recent past, so the engine's clock-skew guard stays on.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from whywait.agents.events import TOPIC_DIAGNOSES
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

from tests.support.kafka import publish_messages as publish
from tests.support.kafka import wait_for
from tests.support.slack_server import SlackServer

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
RULE = "network.straggler-retransmits"
FAULT1 = (120, 330)  # node-04, seconds after start
FAULT2 = (380, 470)  # node-06 overheats (same job), only after the restart
CUT = 220  # engine A sees up to here


async def diagnoses_end(bootstrap: str) -> int:
    """The diagnoses topic's end offset: nothing this test's engines write comes before it."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        tp = TopicPartition(TOPIC_DIAGNOSES, 0)
        return int((await c.end_offsets([tp]))[tp])
    finally:
        await c.stop()


async def diagnoses_since(bootstrap: str, start: float, job: str, offset: int) -> list[dict]:
    """Every diagnosis for ``job`` on the diagnoses topic detected at or after ``start``, read from ``offset`` (the
    topic's end when the test began: on the suite's shared broker everything before it is other tests', and this is
    polled several times a second)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    out = []
    try:
        tp = TopicPartition(TOPIC_DIAGNOSES, 0)
        c.assign([tp])
        c.seek(tp, offset)
        end = (await c.end_offsets([tp]))[tp]
        while await c.position(tp) < end:
            for m in (await c.getmany(tp, timeout_ms=1000)).get(tp, []):
                d = json.loads(m.value)
                if d.get("job") == job and d.get("detected_at", 0) >= start:
                    out.append(d)
    finally:
        await c.stop()
    return out


def _consuming_at(log: Path) -> float | None:
    """Wall time (the log line's own clock is not needed: we poll) when the engine logs it consumes."""
    return time.time() if log.exists() and "engine: consuming" in log.read_text() else None


@pytest.mark.parametrize("stop", ["kill", "term"])
def test_restart_mid_incident_keeps_it_open_and_stays_watching(kafka_bootstrap: str, tmp_path: Path,
                                                                 stop: str) -> None:
    from whywait.engine.stream.topics import ensure_topics

    ensure_topics(kafka_bootstrap)
    since = asyncio.run(diagnoses_end(kafka_bootstrap))
    rule = load_rules([REPO / "rules"]).rules[RULE]
    # Recent past, distinct per variant so the two runs' event times never overlap.
    start = float(int(time.time()) - 1200 - (0 if stop == "kill" else 2400))
    job = f"restart-{stop}-{int(start)}"
    topo = make_cluster(nodes=8)
    infra = Topology.from_dict(topo.to_dict())
    sim = Simulation(topo, [make_job(topo, job=job, channel="#ml-platform")],
                     [make_fault("nic-packet-loss", "node-04", *FAULT1),
                      make_fault("gpu-thermal", "node-06", *FAULT2)],
                     start_time=start, duration_s=560, seed=4)
    msgs = list(sim.messages())
    cut = next(i for i, (_, m) in enumerate(msgs) if m["time"] >= start + CUT)
    topo_file = tmp_path / "topology.yaml"
    infra.to_yaml(topo_file)
    group = f"restart-{stop}-{start:.0f}"
    with SlackServer(channels=["#ml-platform", "#whywait"], token="xoxb-r") as slack:
        env = {**os.environ, "SLACK_BOT_TOKEN": "xoxb-r", "WHYWAIT_SLACK_API_URL": slack.url,
               "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONUNBUFFERED": "1",
               "WHYWAIT_NOTIFY_GROUP_WAIT": "0s"}

        def engine(name: str) -> subprocess.Popen:  # type: ignore[type-arg]
            return subprocess.Popen(
                [sys.executable, "-m", "whywait", "engine", "--topology", str(topo_file), "--group", group,
                 "--not-before", str(start), "--latest"],
                stdout=(tmp_path / f"{name}.log").open("w"), stderr=subprocess.STDOUT, cwd=REPO,
                env={**env, "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / f"outbox-{name}")})

        a = engine("a")
        try:
            assert wait_for(lambda: _consuming_at(tmp_path / "a.log") is not None, 90), \
                (tmp_path / "a.log").read_text()
            asyncio.run(publish(kafka_bootstrap, msgs[:cut]))
            assert wait_for(lambda: len(slack.roots("#ml-platform")) == 1), (tmp_path / "a.log").read_text()
            # A periodic checkpoint (every 10 s) holds the firing incident: wait for the summary line it logs once
            # all of A's input is evaluated (it was a fixed 12 s), and a moment for its write to reach the broker.
            assert wait_for(lambda: re.search(rf"engine: {cut:,} message\(s\) evaluated.*; [1-9]\d* incident\(s\) "
                                              "firing", (tmp_path / "a.log").read_text()) is not None, 30), \
                (tmp_path / "a.log").read_text()[-3000:]
            time.sleep(2)
        finally:
            if stop == "kill":
                a.send_signal(signal.SIGKILL)
            else:
                a.terminate()
            a.wait(30)
        first_ts = slack.roots("#ml-platform")[0].ts
        began = time.time()
        b = engine("b")
        try:
            assert wait_for(lambda: _consuming_at(tmp_path / "b.log") is not None, 60), \
                (tmp_path / "b.log").read_text()
            resumed_s = time.time() - began
            asyncio.run(publish(kafka_bootstrap, msgs[cut:]))
            assert wait_for(lambda: any(
                d["status"] == "firing" and d.get("culprit") == "node-06"
                for d in asyncio.run(diagnoses_since(kafka_bootstrap, start, job, since))), 90), \
                (tmp_path / "b.log").read_text()[-3000:]
            assert wait_for(lambda: any(
                d["status"] == "resolved" and d.get("culprit") == "node-06"
                for d in asyncio.run(diagnoses_since(kafka_bootstrap, start, job, since))), 60), \
                (tmp_path / "b.log").read_text()[-3000:]
        finally:
            b.terminate()
            b.wait(30)
        blog = (tmp_path / "b.log").read_text()
        # The firing packet-loss incident, and any the network rule mutes (job.whole-job-slow holds through the
        # loss, as every rank's communication grew, and is checkpointed unannounced): restored, none posted.
        assert re.search(r"restored [1-9]\d* incident\(s\)", blog), blog[-3000:]
        assert resumed_s < 10.0, f"engine B took {resumed_s:.1f}s to start consuming"
        print(f"restart ({stop}): engine B consuming {resumed_s:.1f}s after it was started")

        diags = asyncio.run(diagnoses_since(kafka_bootstrap, start, job, since))
        node4 = [d for d in diags if d["rule_id"] == RULE and d.get("culprit") == "node-04"]
        resolved = [d for d in node4 if d["status"] == "resolved"]
        assert len(resolved) == 1, [(d["status"], d["detected_at"] - start) for d in node4]
        ends = resolved[0]["ends_at"] - start
        # Not before the fault ends; no later than keep_firing_for plus the windows and lateness.
        assert FAULT1[1] <= ends <= FAULT1[1] + rule.keep_firing_for_s + 15, ends
        # One root for node-04 (edited on resolve), one for node-06: nothing posted twice.
        roots = slack.roots("#ml-platform")
        assert roots[0].ts == first_ts
        assert len(roots) == 2, [m.all_text[:80] for m in roots]
        assert "node-06" in roots[1].all_text
        edits = [c for c in slack.calls_to("chat.update") if "RESOLVED" in (c.text or "").upper()]
        assert first_ts in {c.ts for c in edits}
