"""A node whose clock runs ahead, through the real parts: simulator → Kafka → the live engine → diagnoses topic.

node-03's clock runs 120 s ahead while node-07's NIC loses packets.  With each input's progress taken as
its newest stamp (before ``engine/evaluate/frontier.py``), the live engine, fed at 4x real time, found
node-07's fault 50 s after it began instead of within 20 s (measured by making the frontier return its raw
maximum); offline, the rule tests beside ``network.straggler-retransmits`` did not find it at all.  Now the
engine names node-03's clock and finds node-07's packet loss on time, and nothing else fires.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_end_to_end import REPO, consume, whywait

pytestmark = pytest.mark.integration


def test_one_node_ahead_neither_blinds_the_engine_nor_goes_unnamed(kafka_bootstrap: str, tmp_path: Path) -> None:
    from whywait.agents.events import TOPIC_DIAGNOSES
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster

    ensure_topics(kafka_bootstrap)
    topo = tmp_path / "topology.yaml"
    make_cluster(nodes=8).to_yaml(topo)
    # 22 days ahead: above test_backlog_alignment's events (20 d), below test_receivers' (25 d) and
    # test_end_to_end's (30 d), which read every diagnosis after their own start.  --latest: this engine
    # reads only what is produced after it started, never another test's events.
    start = float(int(time.time()) + 86_400 * 22)
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONUNBUFFERED": "1",
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox")}
    env.pop("SLACK_BOT_TOKEN", None)
    log = (tmp_path / "engine.log").open("w")
    engine = subprocess.Popen(whywait("engine", "--topology", str(topo), "--group", f"skew-{start:.0f}",
                                      "--not-before", str(start), "--no-restore", "--latest",
                                      "--max-clock-skew", "off"),
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        ready = time.time() + 90
        while "engine: consuming" not in (tmp_path / "engine.log").read_text() and engine.poll() is None \
                and time.time() < ready:
            time.sleep(0.2)
        assert "engine: consuming" in (tmp_path / "engine.log").read_text(), (tmp_path / "engine.log").read_text()
        # 4x real time, as a live feed (at full speed the engine reads a backlog, which its reorder buffer
        # sorts by event time before the evaluator sees it, and no clock could mislead it).
        # 140 s of event time (it was 180, 45 s of wall time): node-07's fault must be found by 120 s, so the faults
        # last to 135 s and the run ends soon after.
        subprocess.run(whywait("simulate", "--nodes", "8", "--duration", "140", "--speed", "4", "--seed", "3",
                               "--fault", "clock-skew:node-03@20-135,offset_s=120",
                               "--fault", "nic-packet-loss:node-07@100-135", "--start-time", str(start)),
                       env=env, cwd=REPO, check=True, timeout=180)
        want = {("job.node-clock-skew", "node-03"), ("network.straggler-retransmits", "node-07")}
        got: list[dict] = []
        deadline = time.time() + 120
        while time.time() < deadline and not want <= {(d["rule_id"], d["culprit"]) for d in got}:
            got = asyncio.run(consume(kafka_bootstrap, TOPIC_DIAGNOSES, time.time() + 5, want=100,
                                      match=lambda d: d.get("status") == "firing"
                                      and start <= d.get("detected_at", 0) <= start + 1000))
    finally:
        engine.terminate()
        engine.wait(30)
        log.close()
    fired = {(d["rule_id"], d["culprit"]): d["detected_at"] - start for d in got}
    assert want <= fired.keys(), (fired, (tmp_path / "engine.log").read_text()[-3000:])
    assert 100 <= fired[("network.straggler-retransmits", "node-07")] <= 120, fired
    assert fired.keys() == want, fired  # nothing else: no false checkpoint or silence alarm
