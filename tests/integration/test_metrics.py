"""``whywait engine --metrics-addr`` scraped while it works: real broker, real engine process, real simulation.

The engine is started with metrics on a free port; /readyz must turn 200 once it consumes; a short simulation with a
fault (node-03's NIC dropping packets) goes through Kafka; /metrics, read with prometheus_client's parser, must
count the events, show the lag per partition, a populated tick histogram, a diagnosis fired and a Slack delivery.
The shipped dashboard's and alert rules' metric names are checked against this very scrape.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.observe.test_deploy import ALERTS, DASHBOARD, alert_exprs, dashboard_exprs, metric_names
from tests.support.slack_server import SlackServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NODES, DURATION, FAULT = 8, 200, (100, 180)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:  # not listening yet
        return 0, str(e)


def samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@dataclass
class Scrape:
    ready_while_consuming: tuple[int, str]
    ready_before: list[tuple[int, str]]
    text: str
    metrics: dict[str, dict[tuple[tuple[str, str], ...], float]]
    engine_log: str


@pytest.fixture(scope="module")
def scrape(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    from whywait.engine.stream.topics import ensure_topics
    from whywait.simulate.cluster import make_cluster

    work = tmp_path_factory.mktemp("metrics")
    ensure_topics(kafka_bootstrap)
    topo = work / "topology.yaml"
    make_cluster(nodes=NODES).to_yaml(topo)
    # Its own stretch of event time (end_to_end +30 d, receivers +25 d, replay +45 d): no other test's events
    # land in its windows, nor its in theirs.  Before replay's +45 d, because replay's engine reads the topics
    # from its --not-before on: a later test's events already there would move its clock past its own.
    start = float(int(time.time()) + 86_400 * 40)
    rules = work / "rules"
    shutil.copytree(REPO / "rules", rules)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with SlackServer(channels=["#ml-platform", "#whywait"], token="xoxb-metrics") as slack:
        env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "SLACK_BOT_TOKEN": "xoxb-metrics",
               "WHYWAIT_SLACK_API_URL": slack.url, "PYTHONUNBUFFERED": "1",
               "WHYWAIT_NOTIFY_OUTBOX": str(work / "outbox")}
        log = (work / "engine.log").open("w")
        engine = subprocess.Popen(
            [sys.executable, "-m", "whywait", "--log-format", "json", "engine", "--topology", str(topo),
             "--group", f"metrics-{start:.0f}", "--not-before", str(start), "--no-restore", "--latest",
             "--max-clock-skew", "off", "--metrics-addr", f"127.0.0.1:{port}", "--rules", str(rules)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            before: list[tuple[int, str]] = []
            deadline = time.time() + 90
            ready = get(url + "/readyz")
            while time.time() < deadline and ready[0] != 200 and engine.poll() is None:
                if ready[0]:
                    before.append(ready)
                time.sleep(0.5)
                ready = get(url + "/readyz")
            assert ready[0] == 200, (ready, (work / "engine.log").read_text()[-3000:])
            # an edit the reloader must refuse (the last good rules keep running): counted
            (rules / "network.bad.yaml").write_text(
                "apiVersion: whywait/v1\nid: network.bad\ntitle: t\ncause: c\nnext_step: n\n"
                "when:\n  type: threshold\n  metric: net.tcp_retrans_segs_per_s\n  value: 5\n")
            subprocess.run([sys.executable, "-m", "whywait", "simulate", "--nodes", str(NODES), "--duration",
                            str(DURATION), "--speed", "0", "--fault",
                            f"nic-packet-loss:node-03@{FAULT[0]}-{FAULT[1]}", "--start-time", str(start)],
                           env=env, cwd=REPO, check=True, timeout=180, capture_output=True)
            deadline = time.time() + 120
            text = ""
            while time.time() < deadline:
                code, text = get(url + "/metrics")
                m = samples(text) if code == 200 else {}
                fired = sum(m.get("whywait_engine_diagnoses_fired_total", {}).values())
                sent = sum(v for k, v in m.get("whywait_notifications_total", {}).items() if ("outcome", "sent") in k)
                net = m.get("whywait_engine_events_total", {}).get((("topic", "whywait.net.v1"),), 0)
                refused = m.get("whywait_engine_rule_reload_failures_total", {}).get((), 0)
                if fired and sent and refused and net >= NODES * DURATION:  # the whole simulation consumed
                    break
                time.sleep(1.0)
            consuming = get(url + "/readyz")
        finally:
            engine.terminate()
            engine.wait(30)
            log.close()
        yield Scrape(consuming, before, text, samples(text), (work / "engine.log").read_text())


def test_ready_only_once_consuming(scrape: Scrape) -> None:
    assert scrape.ready_while_consuming == (200, "ready\n")
    # before it was ready it said why, in one line (it may also have been quick enough never to say it)
    assert all(code == 503 and body.startswith("not ready: ") and body.count("\n") == 1
               for code, body in scrape.ready_before), scrape.ready_before


def test_events_lag_ticks_and_diagnoses_are_scraped(scrape: Scrape) -> None:
    m = scrape.metrics
    assert m, scrape.engine_log[-3000:]
    events = m["whywait_engine_events_total"]
    assert events[(("topic", "whywait.net.v1"),)] >= NODES * DURATION
    assert events[(("topic", "whywait.gpu.v1"),)] >= NODES * DURATION
    lag = m["whywait_engine_consumer_lag"]
    assert (("partition", "0"), ("topic", "whywait.net.v1")) in lag and all(v >= 0 for v in lag.values())
    assert m["whywait_engine_assigned_partitions"][()] == len(lag) >= 5
    assert m["whywait_engine_tick_duration_seconds_count"][()] >= DURATION - 60
    assert m["whywait_engine_tick_duration_seconds_sum"][()] > 0
    fired = m["whywait_engine_diagnoses_fired_total"]
    assert fired.get((("rule", "network.straggler-retransmits"),), 0) >= 1, fired
    assert m["whywait_engine_jobs"][()] >= 1 and m["whywait_engine_nodes_reporting"][()] == NODES
    assert m["whywait_engine_rules_loaded"][()] > 20
    assert m["whywait_engine_rule_reload_failures_total"][()] == 1  # one refused edit, not one per poll
    sent = m["whywait_notifications_total"]
    assert sum(v for k, v in sent.items() if ("outcome", "sent") in k) >= 1, sent


def test_engine_logs_are_json_lines(scrape: Scrape) -> None:
    import json

    lines = [json.loads(x) for x in scrape.engine_log.splitlines() if x.strip()]  # every line, faust's too
    assert any(d["message"].startswith("engine: consuming") for d in lines), scrape.engine_log[-2000:]
    assert all({"time", "level", "logger", "message"} <= set(d) for d in lines)


def test_dashboard_and_alerts_use_only_what_the_engine_exports(scrape: Scrape) -> None:
    exported: set[str] = set()
    for fam in text_string_to_metric_families(scrape.text):  # a family with no sample yet still counts
        exported |= {fam.name, *(s.name for s in fam.samples)}
        if fam.type == "counter":
            exported.add(fam.name + "_total")
        elif fam.type == "histogram":
            exported |= {fam.name + s for s in ("_bucket", "_sum", "_count")}
    used = metric_names(dashboard_exprs(DASHBOARD)) | metric_names(alert_exprs(ALERTS))
    engine_used = {n for n in used if not n.startswith("whywait_agent_")}  # the agent's: tests/observe/test_deploy
    assert engine_used and engine_used <= exported, sorted(engine_used - exported)
