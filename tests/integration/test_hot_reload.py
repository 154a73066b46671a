"""Hot reload in the running engine: a bad edit is refused, announced on the ops channel, and recovered."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.rules.test_schema import GOOD
from tests.support.kafka import wait_for
from tests.support.slack_server import SlackServer

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_bad_edit_is_refused_and_announced(kafka_bootstrap: str, tmp_path: Path) -> None:
    from whywait.simulate.cluster import make_cluster

    rules = tmp_path / "rules"
    rules.mkdir()
    rule = rules / "network.test-rule.yaml"
    rule.write_text(GOOD)
    topo = tmp_path / "topology.yaml"
    make_cluster(nodes=4).to_yaml(topo)
    log_path = tmp_path / "engine.log"
    with SlackServer(channels=["#whywait"], token="xoxb-reload") as slack, log_path.open("w") as log:
        env = {**os.environ, "SLACK_BOT_TOKEN": "xoxb-reload", "WHYWAIT_SLACK_API_URL": slack.url,
               "WHYWAIT_NOTIFY_OUTBOX": str(tmp_path / "outbox"), "PYTHONUNBUFFERED": "1"}
        engine = subprocess.Popen(
            [sys.executable, "-m", "whywait", "engine", "--bootstrap", kafka_bootstrap, "--rules", str(rules),
             "--topology", str(topo), "--group", f"reload-{time.time():.0f}", "--latest", "--no-restore"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            assert wait_for(lambda: "engine: 1 rule(s)" in log_path.read_text()), log_path.read_text()
            time.sleep(4)  # past the first reload poll
            rule.write_text(GOOD.replace("window: 5s", "window: five"))
            assert wait_for(lambda: any("Rule reload refused" in m.all_text for m in slack.roots("#whywait")),
                            timeout=45), log_path.read_text()[-2000:]
            text = slack.roots("#whywait")[0].all_text
            assert f"{rule}:10" in text and "'when.all[0].window' must be a duration" in text
            assert "rule reload refused, keeping the last good rules" in log_path.read_text()
            assert engine.poll() is None  # still running on the last good rules
            rule.write_text(GOOD)
            assert wait_for(lambda: "rules reloaded: 1 rule(s)" in log_path.read_text())
            assert wait_for(lambda: len(slack.calls_to("chat.update")) >= 1)
        finally:
            engine.terminate()
            engine.wait(30)
