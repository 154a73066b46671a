"""Replay through the real broker: an incident the live engine diagnosed, replayed to the same diagnoses at the
same event times; a stale placement on the topic; export to a bundle and replay it with no broker; import back."""

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
from whywait.agents.events import TOPIC_DIAGNOSES, TOPIC_PLACEMENT, envelope

from tests.integration.test_end_to_end import consume
from tests.support.workers import private_broker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DURATION = 260


def whywait(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "whywait", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=env)


@dataclass
class Live:
    bootstrap: str
    start: float
    topo: Path
    work: Path
    diagnoses: list[dict[str, Any]]


# The module's own broker.  Its events lie 45 days ahead while the producers stamp records with the wall clock, so
# every replay, export and digest here reads each input partition from its start (see _kafka_agen): on the
# suite's shared broker that was everything every earlier test had left there (249 s for the export test alone in
# the full suite, 22 s on its own).  Replay amid another test's junk: tests/replay/test_replay_project_kafka.py.
broker = private_broker


@pytest.fixture(scope="module")
def live(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster

    from tests.support.kafka import publish_messages

    kafka_bootstrap = broker
    work = tmp_path_factory.mktemp("replay-kafka")
    ensure_topics(kafka_bootstrap)
    topo = work / "topology.yaml"
    make_cluster(nodes=8).to_yaml(topo)
    start = float(int(time.time()) + 86_400 * 45)  # its own stretch of event time
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONUNBUFFERED": "1"}
    env.pop("SLACK_BOT_TOKEN", None)
    # A placement for a node the topology does not hold (a stale job from an old cluster layout).
    stale = envelope("placement", "sched", start + 1, job=f"stale-{start:.0f}", project="old", team="t",
                     state="running", ranks=[{"rank": 0, "node": "node-99", "gpu": 0}])
    asyncio.run(publish_messages(kafka_bootstrap, [(TOPIC_PLACEMENT, stale)]))
    with (work / "engine.log").open("w") as log:
        engine = subprocess.Popen([sys.executable, "-m", "whywait", "engine", "--topology", str(topo), "--group",
                                   f"replay-{start:.0f}", "--not-before", str(start), "--no-restore",
                                   "--max-clock-skew", "off"],  # its event time runs 45 days ahead
                                  stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            subprocess.run([sys.executable, "-m", "whywait", "simulate", "--nodes", "8", "--duration",
                            str(DURATION), "--speed", "0", "--fault", "nic-packet-loss:node-05@120-200",
                            "--start-time", str(start)], env=env, cwd=REPO, check=True, timeout=180,
                           capture_output=True)
            diags = asyncio.run(consume(kafka_bootstrap, TOPIC_DIAGNOSES, time.time() + 120, want=2,
                                        match=lambda d: start <= d.get("detected_at", 0) <= start + DURATION))
            time.sleep(3)  # anything else the engine concludes from the same data
            diags = asyncio.run(consume(kafka_bootstrap, TOPIC_DIAGNOSES, time.time() + 5, want=100,
                                        match=lambda d: start <= d.get("detected_at", 0) <= start + DURATION))
        finally:
            engine.terminate()
            engine.wait(30)
    yield Live(kafka_bootstrap, start, topo, work, diags)


def key(d: dict[str, Any]) -> tuple:
    return (d["rule_id"], d["fingerprint"], d["status"], d["starts_at"], d["detected_at"], d["culprit"])


def test_replay_gets_the_live_engines_diagnoses_at_the_same_event_times(live: Live) -> None:
    assert any(d["status"] == "firing" and d["culprit"] == "node-05" for d in live.diagnoses), live.diagnoses
    out = live.work / "replay.jsonl"
    r = whywait("replay", "--bootstrap", live.bootstrap, "--topology", str(live.topo), "--since", str(live.start),
                "--until", str(live.start + DURATION), "--lead", "0s", "--json", str(out))
    assert r.returncode == 0, r.stderr
    replayed = [json.loads(x) for x in out.read_text().splitlines()]
    # The live engine stops at the data's end; the replay also closes what was still open then.
    last_live = max(d["detected_at"] for d in live.diagnoses)
    assert sorted(map(key, live.diagnoses)) == sorted(key(d) for d in replayed if d["detected_at"] <= last_live)
    assert "skipped 1: placement skipped: unknown node 'node-99'" in r.stdout, r.stdout


def test_export_bundle_replays_without_kafka_identically_and_imports_back(live: Live) -> None:
    bundle = live.work / "incident.whywait"
    # Only the simulated job: other jobs' placements (the stale one; on a shared broker other tests' too, such as
    # the fuzz test's ~100 hostile ones) would be read as well, and the latest placement of each job from before
    # the window stands in for it once per replay, so with them in the window the "every message twice" count
    # below would be off by their number.
    jobs = sorted({d["job"] for d in live.diagnoses})
    win = ["--since", str(live.start), "--until", str(live.start + DURATION), "--lead", "0s",
           *(a for j in jobs for a in ("--job", j))]
    r = whywait("export", "--bootstrap", live.bootstrap, "--topology", str(live.topo), *win, "-o", str(bundle))
    assert r.returncode == 0, r.stderr
    assert bundle.stat().st_size > 10_000
    from_kafka, from_bundle = live.work / "k.jsonl", live.work / "b.jsonl"
    r1 = whywait("replay", "--bootstrap", live.bootstrap, "--topology", str(live.topo), *win, "--json",
                 str(from_kafka), "--report", str(live.work / "report-kafka"))
    r2 = whywait("replay", "--input", str(bundle), "--bootstrap", "127.0.0.1:1", "--json", str(from_bundle),
                 "--report", str(live.work / "report"))
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    assert from_kafka.read_bytes() == from_bundle.read_bytes() and from_kafka.stat().st_size > 0
    html = (live.work / "report" / "report.html").read_text()
    assert "node-05" in html and "GPU-hours lost" in html
    # the same report from the topics (which also looks up the live Slack threads: none here)
    def story(p: Path) -> str:  # other tests' junk on the shared topics shows in the topics' "skipped" counts only
        return p.read_text().split("## What the replay read")[0]

    assert story(live.work / "report-kafka" / "report.md") == story(live.work / "report" / "report.md")
    n = int(r1.stdout.split("replayed ")[1].split()[0])
    # Back into the topics (here the same broker: every message of the window is now there twice).
    r = whywait("import", str(bundle), "--bootstrap", live.bootstrap)
    assert r.returncode == 0, r.stderr
    assert f"published {n + 1}" in r.stdout or f"published {n}" in r.stdout  # + the stale placement
    r3 = whywait("replay", "--bootstrap", live.bootstrap, "--topology", str(live.topo), *win)
    # every message twice, except placements from before the window: the latest per job stands in for them
    assert 2 * n - 4 <= int(r3.stdout.split("replayed ")[1].split()[0]) <= 2 * n, (r1.stdout, r3.stdout)


def test_broker_outage_is_one_line(live: Live, tmp_path: Path) -> None:
    from whywait.engine.localkafka.broker import free_port

    r = whywait("replay", "--bootstrap", f"127.0.0.1:{free_port()}", "--topology", str(live.topo),
                "--since", "-10m", timeout=60)
    assert r.returncode == 3 and "is unreachable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = whywait("export", "--bootstrap", f"127.0.0.1:{free_port()}", "--since", "-10m", "-o",
                str(tmp_path / "x.whywait"), timeout=60)
    assert r.returncode == 3 and "is unreachable" in r.stderr and not (tmp_path / "x.whywait").exists()


def test_digest_counts_the_incidents_gpu_hours(live: Live) -> None:
    out = live.work / "digest.json"
    r = whywait("digest", "--bootstrap", live.bootstrap, "--since", str(live.start), "--until",
                str(live.start + DURATION), "--json", str(out), "--plot", str(live.work / "digest.png"))
    assert r.returncode == 0, r.stderr
    rows = {row["job"]: row for row in json.loads(out.read_text())}
    llm = rows["train-llm"]
    # every GPU of the job (8 nodes of the simulator's default 8 GPUs) for ~260 s of steps (the bundle
    # import above doubled the steps: at most twice that)
    gpus = 8 * 8
    assert gpus * 250 / 3600 <= llm["gpu_hours_used"] <= 2 * gpus * 262 / 3600
    assert llm["lost_by_cause"].get("network", 0) > 0
    assert (live.work / "digest.png").read_bytes()[:4] == b"\x89PNG"


def test_demo_timeline_draws_from_kafka(live: Live) -> None:
    from whywait.engine.commands.replay_cmd import plot_window

    png = plot_window(live.bootstrap, live.topo, [REPO / "rules"], live.start, live.start + DURATION,
                      live.work / "demo.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_missing_topics_are_one_clear_error(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    import whywait.agents.events
    from whywait.engine.commands.replay_cmd import kafka_batches
    from whywait.engine.errors import ConfigError
    from whywait.engine.replay import EventTimeMerge, Window

    # A cluster where no input topic was ever created (the wrong cluster, or nothing ever published): one line.
    # One missing topic is not an error (a cluster that ran `whywait simulate` but never the engine has no
    # agent-health topic): replay reads the others and notes it (tests/replay/test_replay_newuser_kafka.py).
    events = whywait.agents.events
    monkeypatch.setattr(events, "INPUT_TOPICS", ("whywait.never-created.v1", "whywait.never-created-2.v1"))
    w = Window(live.start, live.start + 10)
    with pytest.raises(ConfigError, match=r"none of the input topics"):
        list(kafka_batches(live.bootstrap, w, EventTimeMerge([], w)))
