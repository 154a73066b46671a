"""A topology naming hosts by their FQDN, agents and the scheduler by short names, through the real parts.

Simulator → Kafka → the live engine → diagnoses topic.  The cluster file says ``node-07.cluster.local``;
the simulated agents publish as ``node-07`` and its placements name ``node-07`` (what Slurm and a short
``hostname`` give).  Before node names were matched, the engine dead-lettered every sample as from an
unknown node and every placement as naming one, and found nothing; now it finds node-07's packet loss and
names the host as the topology does.  A typo'd agent name is dead-lettered with the similar names the
topology holds, so the operator can fix the agent's ``--node``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_end_to_end import REPO, consume, whywait

pytestmark = pytest.mark.integration


def test_short_names_match_the_topology_fqdns_live(kafka_bootstrap: str, tmp_path: Path) -> None:
    from whywait.agents.events import TOPIC_DEADLETTER, TOPIC_DIAGNOSES, TOPIC_HOST, encode, envelope
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster
    from whywait.topology.model import Topology

    from tests.integration.test_end_to_end import produce_raw

    ensure_topics(kafka_bootstrap)
    cluster = make_cluster(nodes=8).to_dict(include_jobs=False)
    for n in cluster["nodes"]:
        n["id"] = f"{n['id']}.cluster.local"
    topo = tmp_path / "topology.yaml"
    Topology.from_dict(cluster).to_yaml(topo)
    # 27 days ahead: apart from the event times of the other live tests (20, 22, 25 and 30 days), and
    # --latest: this engine reads only what is produced after it started.
    start = float(int(time.time()) + 86_400 * 27)
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONUNBUFFERED": "1",
           "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox")}
    env.pop("SLACK_BOT_TOKEN", None)
    log_path = tmp_path / "engine.log"
    log = log_path.open("w")
    engine = subprocess.Popen(whywait("engine", "--topology", str(topo), "--group", f"names-{start:.0f}",
                                      "--not-before", str(start), "--no-restore", "--latest",
                                      "--max-clock-skew", "off"),
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        ready = time.time() + 90
        while "engine: consuming" not in log_path.read_text() and engine.poll() is None and time.time() < ready:
            time.sleep(0.2)
        assert "engine: consuming" in log_path.read_text(), log_path.read_text()
        typo = envelope("host", "node-7", start + 1, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=1,
                        mem_total_bytes=2)
        asyncio.run(produce_raw(kafka_bootstrap, [(TOPIC_HOST, encode(typo))]))
        subprocess.run(whywait("simulate", "--nodes", "8", "--duration", "200", "--speed", "0", "--seed", "3",
                               "--fault", "nic-packet-loss:node-07@90-190", "--start-time", str(start)),
                       env=env, cwd=REPO, check=True, timeout=180)
        got = asyncio.run(consume(kafka_bootstrap, TOPIC_DIAGNOSES, time.time() + 90, want=1,
                                  match=lambda d: d.get("status") == "firing"
                                  and start <= d.get("detected_at", 0) <= start + 1000))

        def ours(d: dict) -> bool:  # a dead letter of this test's event times
            # the shared broker's dead letters hold other tests' hostile input too (JSON nested past the
            # parser's stack, values of every type): anything unreadable is not this test's
            try:
                return start <= float(json.loads(d.get("value") or "{}").get("time", 0)) <= start + 1000
            except (ValueError, AttributeError, TypeError, RecursionError):
                return False

        dead = asyncio.run(consume(kafka_bootstrap, TOPIC_DEADLETTER, time.time() + 10, want=10_000, match=ours))
    finally:
        engine.terminate()
        engine.wait(30)
        log.close()
    text = log_path.read_text()
    assert [(d["rule_id"], d["culprit"]) for d in got] == [("network.straggler-retransmits",
                                                            "node-07.cluster.local")], text[-3000:]
    assert got[0]["job"] == "train-llm" and set(got[0]["ranks"]) == set(range(48, 56))
    # Only the typo was refused: no sample nor placement of the simulated cluster, and its reason says what to do.
    assert [(d["category"], json.loads(d["value"])["node"]) for d in dead] == [("unknown_node", "node-7")], dead
    assert "similar: node-07.cluster.local" in dead[0]["reason"] and "--node" in dead[0]["reason"]
    assert "telemetry from node node-7 is dead-lettered" in text
