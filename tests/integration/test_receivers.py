"""Slack and Alertmanager from one pipeline, on diagnoses the engine makes from the real Kafka broker.

The real parts: simulator → Kafka 4 → ``whywait engine`` (faust) → the notification
pipeline with ``WHYWAIT_RECEIVERS=slack,alertmanager`` → the local Slack Web API
server and a real Alertmanager v0.28.1 (built once from its Go module, cached), whose
own webhook notifications come back to this test.  The fault (node-07's NIC dropping
packets) fires and clears; both receivers must get the incident and its resolution.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.test_end_to_end import REPO, whywait
from tests.support.alertmanager import NO_GO, Alertmanager, NotificationSink, cache_dir, go_available
from tests.support.slack_server import SlackServer

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not go_available() and not (cache_dir() / "alertmanager").is_file(), reason=NO_GO)]

FAULT_START, FAULT_END, DURATION = 120, 260, 300


@dataclass
class Run:
    slack: SlackServer
    am: Alertmanager
    sink: NotificationSink
    engine_log: str
    alerts_after: list[dict[str, Any]]


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster

    work = tmp_path_factory.mktemp("receivers")
    ensure_topics(kafka_bootstrap)
    topo = work / "topology.yaml"
    make_cluster(nodes=16).to_yaml(topo)
    # Event time 25 days ahead: below test_end_to_end's (30 d, which reads every diagnosis after its start)
    # and test_replay_kafka's (45 d); engines with a clock-skew limit refuse it.  --latest: this engine
    # reads only what is produced after it started, never another test's events.
    start = float(int(time.time()) + 86_400 * 25)
    with SlackServer(channels=["#ml-platform", "#whywait"], token="xoxb-rcv") as slack, \
            NotificationSink() as sink, Alertmanager(sink.url, workdir=work / "am") as am:
        env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONUNBUFFERED": "1",
               "WHYWAIT_RECEIVERS": "slack,alertmanager", "SLACK_BOT_TOKEN": "xoxb-rcv",
               "WHYWAIT_SLACK_API_URL": slack.url, "WHYWAIT_ALERTMANAGER_URL": am.url,
               "WHYWAIT_NOTIFY_OUTBOX": str(work / "outbox"), "WHYWAIT_NOTIFY_GROUP_WAIT": "200ms"}
        log = (work / "engine.log").open("w")
        engine = subprocess.Popen(whywait("engine", "--topology", str(topo), "--group", f"rcv-{start:.0f}",
                                          "--not-before", str(start), "--no-restore", "--latest",
                                          "--max-clock-skew", "off"),
                                  stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        alerts_after: list[dict[str, Any]] = []
        try:
            ready = time.time() + 90
            while "engine: consuming" not in (work / "engine.log").read_text() and engine.poll() is None \
                    and time.time() < ready:
                time.sleep(0.2)
            assert "engine: consuming" in (work / "engine.log").read_text(), (work / "engine.log").read_text()[-3000:]
            subprocess.run(whywait("simulate", "--nodes", "16", "--duration", str(DURATION), "--speed", "0",
                                   "--fault", f"nic-packet-loss:node-07@{FAULT_START}-{FAULT_END}",
                                   "--start-time", str(start)),
                           env=env, cwd=REPO, check=True, timeout=180)
            deadline = time.time() + 120
            while time.time() < deadline and not (
                    slack.calls_to("chat.update")
                    and any(n["status"] == "resolved" for n in sink.notifications)):
                time.sleep(0.3)
            alerts_after = am.alerts()
        finally:
            engine.terminate()
            engine.wait(30)
            log.close()
        yield Run(slack, am, sink, (work / "engine.log").read_text(), alerts_after)


def test_slack_gets_the_incident_and_edits_it_on_resolve(run: Run) -> None:
    roots = run.slack.roots("#ml-platform")
    assert len(roots) == 1, run.engine_log[-3000:]
    root = roots[0]
    assert "node-07" in root.all_text and "train-llm" in root.all_text
    assert root.edits and "RESOLVED" in root.text.upper()
    assert any("resolved at" in m.text for m in run.slack.thread(root.ts))


def test_alertmanager_gets_the_incident_and_shows_it_resolved(run: Run) -> None:
    firing = run.sink.wait_for(lambda n: n["status"] == "firing", timeout=1)
    alert = next(a for a in firing["alerts"] if a["labels"].get("node") == "node-07")
    labels = alert["labels"]
    assert labels["alertname"] == "network.straggler-retransmits", run.engine_log[-3000:]
    assert (labels["job"], labels["project"], labels["team"]) == ("train-llm", "llm", "ml-platform")
    assert labels["cause"] == "network.packet-loss" and labels["severity"] in ("warning", "critical")
    assert "node-07" in alert["annotations"]["summary"] and alert["annotations"]["runbook_url"]
    resolved = run.sink.wait_for(lambda n: n["status"] == "resolved", timeout=1)
    assert any(a["labels"].get("node") == "node-07" and a["status"] == "resolved" for a in resolved["alerts"])
    assert [a for a in run.alerts_after if a["labels"].get("node") == "node-07"] == []  # no longer active


def test_both_receivers_share_one_incident(run: Run) -> None:
    """The Slack message's buttons and Alertmanager's annotation carry the same incident id."""
    firing = run.sink.wait_for(lambda n: n["status"] == "firing", timeout=1)
    incident = next(a for a in firing["alerts"] if a["labels"].get("node") == "node-07")["annotations"]["incident"]
    root = run.slack.roots("#ml-platform")[0]
    assert incident in str(root.blocks)
    assert "notifications go to: slack, alertmanager" in run.engine_log
