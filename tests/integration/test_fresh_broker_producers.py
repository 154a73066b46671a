"""On a fresh broker, `whywait import` then `whywait simulate` both publish everything: the topics are created as
the engine makes them (the placement topic compacted) before the first send, and each producer waits for their
leaders.  Before, the import auto-created bare topics and a simulate right after it stopped half published on
NotLeaderForPartition, reported as "Kafka ... is unreachable" (exit 3; 2 of 2 runs of a new user's session)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_import_then_simulate_on_a_fresh_broker(tmp_path: Path) -> None:
    from whywait.agents.events import TOPIC_PLACEMENT
    from whywait.engine.localkafka import broker as lb

    if not lb.jars_fetched():
        pytest.skip("no Kafka jars for a private broker")
    b = lb.LocalBroker(detached=False)
    bootstrap = b.start(data_dir=tmp_path / "kafka")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "WHYWAIT_"))}
    env["WHYWAIT_KAFKA_BOOTSTRAP"] = bootstrap
    try:
        table = tmp_path / "steps.csv"
        t0 = int(time.time()) - 7200
        table.write_text("timestamp,global_rank,iteration,step_time_ms,hostname\n" + "".join(
            f"{t0 + i},{r},{i},1000,h{r // 2}\n" for i in range(1, 31) for r in range(4)))
        run = [sys.executable, "-m", "whywait"]
        imp = subprocess.run(run + ["import", str(table), "--job", "j", "--project", "p", "--team", "t"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert imp.returncode == 0 and "published 122 messages" in imp.stdout, imp.stdout + imp.stderr
        sim = subprocess.run(run + ["simulate", "--nodes", "4", "--duration", "30", "--speed", "0",
                                    "--start-time", str(t0 + 600)],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert sim.returncode == 0 and "whywait simulate: published" in sim.stderr, sim.stdout + sim.stderr

        from tests.integration.test_slack_kafka_stores import _topic_config

        # made as the engine makes it, not auto-created
        assert asyncio.run(_topic_config(bootstrap, TOPIC_PLACEMENT))["cleanup.policy"] == "compact"
    finally:
        b.stop()
