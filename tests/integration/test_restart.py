"""A restarted engine resumes its incidents: no second Slack message, and the resolve edits the first one.

Engine A sees the fault begin and posts; it is stopped mid-fault; engine B (same consumer group)
restores the checkpointed evaluator state and the notifier's message map from their compacted
topics, sees the fault end, and edits the message A posted.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.simulate.cluster import make_cluster, make_job
from agents.simulate.faults import make_fault
from agents.simulate.sim import Simulation
from tests.support.kafka import publish_messages as publish
from tests.support.kafka import wait_for
from tests.support.slack_server import SlackServer
from topology.model import Topology

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_restart_mid_incident_edits_the_same_message(kafka_bootstrap: str, tmp_path: Path) -> None:
    from engine.stream.topics import ensure_topics

    ensure_topics(kafka_bootstrap)
    start = 2_200_000_000.0  # event time of its own
    topo = make_cluster(nodes=8)
    infra = Topology.from_dict(topo.to_dict())
    sim = Simulation(topo, [make_job(topo, job="restart-job", channel="#ml-platform")],
                     [make_fault("nic-packet-loss", "node-04", 120, 330)], start_time=start, duration_s=420, seed=4)
    msgs = list(sim.messages())
    cut = next(i for i, (_, m) in enumerate(msgs) if m["time"] >= start + 220)
    topo_file = tmp_path / "topology.yaml"
    infra.to_yaml(topo_file)
    group = f"restart-{start:.0f}"
    with SlackServer(channels=["#ml-platform", "#whywait"], token="xoxb-r") as slack:
        env = {**os.environ, "SLACK_BOT_TOKEN": "xoxb-r", "WHYWAIT_SLACK_API_URL": slack.url,
               "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONUNBUFFERED": "1",
               "WHYWAIT_NOTIFY_GROUP_WAIT": "0s"}

        def engine(name: str) -> subprocess.Popen:  # type: ignore[type-arg]
            return subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "engine", "--topology", str(topo_file), "--group", group,
                 "--not-before", str(start)],
                stdout=(tmp_path / f"{name}.log").open("w"), stderr=subprocess.STDOUT, cwd=REPO,
                env={**env, "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / f"outbox-{name}")})

        a = engine("a")
        try:
            asyncio.run(publish(kafka_bootstrap, msgs[:cut]))
            assert wait_for(lambda: len(slack.roots("#ml-platform")) == 1), (tmp_path / "a.log").read_text()
            time.sleep(2)
        finally:
            a.terminate()
            a.wait(30)
        first_ts = slack.roots("#ml-platform")[0].ts
        b = engine("b")
        try:
            asyncio.run(publish(kafka_bootstrap, msgs[cut:]))
            assert wait_for(lambda: any("RESOLVED" in (c.text or "").upper()
                                        for c in slack.calls_to("chat.update"))), (tmp_path / "b.log").read_text()
        finally:
            b.terminate()
            b.wait(30)
        assert "restored 1 incident(s)" in (tmp_path / "b.log").read_text()
        roots = slack.roots("#ml-platform")
        assert [m.ts for m in roots] == [first_ts], [m.all_text[:80] for m in roots]
        resolved = [c for c in slack.calls_to("chat.update") if "RESOLVED" in (c.text or "").upper()]
        assert resolved[-1].ts == first_ts
