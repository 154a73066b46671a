"""Failover: two ``whywait engine`` workers in one group; the one evaluating a job is killed (``kill -9``)
during the job's incident.  The survivor takes the job's partition over within 30 s, continues the
incident from its per-job checkpoint, and edits the Slack message the dead worker posted (the local
Slack Web API server): one root message, never a second, and the resolution is not lost.

Real parts only: a private broker (4-partition topics must not change how other tests' engines run),
the simulator publishing at twice real time, two engine processes, the local Slack server.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.test_scaleout import broker, read_diagnoses  # noqa: F401 - the fixture
from tests.support.slack_server import SlackServer
from tests.support.workers import REPO, Workers, engine_env, whywait

# Several engine processes on one broker take minutes each here: `make test-scaleout` runs them, `make test` does not.
pytestmark = [pytest.mark.integration, pytest.mark.scaleout]

DAY = 86_400
FAULT = (40, 100)
SCENARIO = f"""\
seed: 5
duration_s: 180
cluster: {{nodes: 16}}
jobs:
- {{job: train-llm, project: llm, team: ml-platform, nodes: node-01..node-06}}
- {{job: etl-d, project: etl, team: data-eng, nodes: node-07..node-08}}
- {{job: job-e, project: vision, team: ml-platform, nodes: node-09..node-12}}
- {{job: job-a, project: speech, team: ml-platform, nodes: node-13..node-16}}
faults:
- {{fault: nic-packet-loss, target: node-10, start: {FAULT[0]}, end: {FAULT[1]}}}
"""


def owner_of(logs: list[Path], job: str) -> int | None:
    """The worker whose newest summary line lists ``job`` among its jobs ("jobs on this worker: a, b")."""
    mark = "jobs on this worker: "
    for i, p in enumerate(logs):
        lines = [ln for ln in p.read_text().splitlines() if mark in ln]
        if lines and job in [j.strip() for j in lines[-1].split(mark, 1)[1].split(" and ")[0].split(",")]:
            return i
    return None


@pytest.fixture(scope="module")
def failover(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:  # noqa: F811
    from whywait.simulate.scenario import load_scenario

    work = tmp_path_factory.mktemp("failover")
    scen = work / "scenario.yaml"
    scen.write_text(SCENARIO)
    topo = work / "topology.yaml"
    load_scenario(scen).topology.to_yaml(topo)
    start = float(int(time.time()) + 60 * DAY)  # +60 d: this test's own stretch of event time
    group = f"failover-{start:.0f}"
    with SlackServer(channels=["#ml-platform", "#whywait"], token="xoxb-failover") as slack:
        env = engine_env(broker, SLACK_BOT_TOKEN="xoxb-failover", WHYWAIT_SLACK_API_URL=slack.url)
        workers = Workers(work, topo, group, 2, env, 4,
                          args=("--not-before", str(start), "--max-clock-skew", "off")).start()
        procs, logs = workers.procs, workers.logs
        sim = None
        out: dict[str, Any] = {"slack": slack, "logs": logs, "start": start}
        try:
            workers.wait_settled()
            sim = subprocess.Popen(whywait("simulate", "--scenario", str(scen), "--speed", "2",
                                           "--start-time", str(start)), env=env, cwd=REPO)
            # the incident is posted; then the worker evaluating job-e is killed
            deadline = time.time() + 240
            while time.time() < deadline and not any("job-e" in (c.text or "") for c in slack.posts("#ml-platform")):
                time.sleep(0.5)
            victim = owner_of(logs, "job-e")
            assert victim is not None, [p.read_text()[-2000:] for p in logs]
            killed_at = time.time()
            seen = len(logs[1 - victim].read_text())
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(10)
            survivor = 1 - victim
            deadline = time.time() + 90
            took_at = None
            while time.time() < deadline and took_at is None:
                if "took" in logs[survivor].read_text()[seen:]:
                    took_at = time.time()
                time.sleep(0.5)
            sim.wait(300)
            diags = asyncio.run(read_diagnoses(broker, start, time.time() + 300, group))
            deadline = time.time() + 60
            while time.time() < deadline and not any("RESOLVED" in (c.text or "").upper()
                                                     for c in slack.calls_to("chat.update")):
                time.sleep(0.5)
            out.update(victim=victim, survivor=survivor, killed_at=killed_at, took_at=took_at, diagnoses=diags,
                       survivor_log=logs[survivor].read_text())
            yield out
        finally:
            if sim is not None and sim.poll() is None:
                sim.kill()
            workers.stop()


def test_survivor_takes_over_within_30s(failover: dict[str, Any]) -> None:
    assert failover["took_at"] is not None, failover["survivor_log"][-3000:]
    assert failover["took_at"] - failover["killed_at"] <= 30, failover["took_at"] - failover["killed_at"]


def test_the_incident_is_posted_once_and_its_message_edited(failover: dict[str, Any]) -> None:
    slack = failover["slack"]
    roots = [m for m in slack.roots("#ml-platform") if "job-e" in m.all_text]
    assert len(roots) == 1, [m.all_text[:200] for m in roots]
    updates = [c for c in slack.calls_to("chat.update") if c.ts == roots[0].ts]
    assert any("RESOLVED" in (c.text or "").upper() for c in updates), \
        ([(c.ts, (c.text or "")[:80]) for c in slack.calls_to("chat.update")], failover["survivor_log"][-3000:])


def test_no_diagnosis_is_lost(failover: dict[str, Any]) -> None:
    mine = [d for d in failover["diagnoses"] if d.get("job") == "job-e" and d.get("culprit") == "node-10"]
    assert any(d["status"] == "firing" for d in mine), failover["diagnoses"]
    assert any(d["status"] == "resolved" for d in mine), [(d["rule_id"], d["status"]) for d in mine]
    assert "adopted" in failover["survivor_log"]


def last_counts(log: str) -> dict[str, int]:
    """The newest counters a worker logged (a field of its JSON log's periodic summary line)."""
    import json

    lines = [ln for ln in log.splitlines() if ln.startswith("{") and '"counters"' in ln]
    assert lines, log[-2000:]
    return dict(json.loads(lines[-1])["counters"])


def test_broker_restart_loses_no_event(tmp_path: Path) -> None:
    """The broker stops and starts again while a worker consumes: every event produced is counted once,
    as routed or dead-lettered (``route.redelivered`` counts what the group read again, apart)."""
    from whywait.agents.events import TOPIC_NET
    from whywait.engine.localkafka import broker as lb
    from whywait.simulate.scenario import load_scenario

    from tests.integration.test_end_to_end import produce_raw

    if not lb.jars_fetched():
        pytest.skip("no Kafka jars for a private broker")
    data = tmp_path / "kafka"
    b = lb.LocalBroker(detached=False)
    bootstrap = b.start(data_dir=data)
    port = int(bootstrap.rsplit(":", 1)[1])
    scen = tmp_path / "scenario.yaml"
    scen.write_text(SCENARIO.replace("duration_s: 180", "duration_s: 60"))
    topo = tmp_path / "topology.yaml"
    load_scenario(scen).topology.to_yaml(topo)
    start = float(int(time.time()) + 61 * DAY)
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "WHYWAIT_"))}
    env.update({"WHYWAIT_KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1", "WHYWAIT_RECEIVERS": "console",
                "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox"), "WHYWAIT_LOG_FORMAT": "json"})
    worker = subprocess.Popen(whywait("engine", "--topology", str(topo), "--group", "restart", "--partitions", "4",
                                      "--instance-id", "none", "--not-before", str(start), "--no-restore",
                                      "--max-clock-skew", "off"),
                              stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO, env=env)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and "took" not in log.read_text():
            time.sleep(0.5)
        bad = [(TOPIC_NET, b"{not json"), (TOPIC_NET, b"[]"), (TOPIC_NET, b"\xff\xfe")]
        asyncio.run(produce_raw(bootstrap, bad))
        sim = subprocess.run(whywait("simulate", "--scenario", str(scen), "--speed", "0", "--start-time", str(start)),
                             env=env, cwd=REPO, check=True, timeout=300, capture_output=True, text=True)
        found = re.search(r"published (\d+) messages", sim.stderr + sim.stdout)
        assert found, sim.stderr[-2000:]
        produced = int(found.group(1)) + len(bad)
        b.stop()  # mid-consumption: the worker is still routing the backlog
        time.sleep(3)
        assert b.start(port=port, data_dir=data) == bootstrap
        deadline = time.time() + 300
        counts: dict[str, int] = {}
        while time.time() < deadline:
            time.sleep(5)
            counts = last_counts(log.read_text())
            if counts.get("route.records", 0) >= produced:
                break
        time.sleep(12)  # one more checkpoint line: nothing beyond what was produced
        counts = last_counts(log.read_text())
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        b.stop()
    accounted = sum(counts.get(k, 0) for k in ("route.forwarded", "route.placements", "route.tombstones",
                                               "route.skipped_before_start", "dead_letters"))
    assert counts["route.records"] == produced, (counts, produced)
    assert accounted == produced, (counts, produced)
    assert counts["dead_letters"] == len(bad)
