"""The agent's /metrics (real collectors on this host's /proc, the real server), JSON logs, and the one-line
errors of a bad ``--metrics-addr`` or ``--log-format`` from the real CLI."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from whywait.agents.agent import Agent
from whywait.agents.collectors import HostCollector, StorageCollector
from whywait.agents.observe import JsonFormatter, ObserveServer, agent_registry
from whywait.agents.publisher import MemoryPublisher

REPO = Path(__file__).resolve().parents[2]


def test_agent_metrics_count_rounds_time_and_publishing() -> None:
    broken = StorageCollector("/nonexistent-root")  # every read fails: its errors or its being off must show
    agent = Agent("node-01", [HostCollector("/"), broken], MemoryPublisher(), interval=0.05, socket_path=None)
    asyncio.run(agent.run(rounds=3))
    server = ObserveServer(("127.0.0.1", 0), agent_registry(agent)).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    finally:
        server.stop()

    def value(name: str, **labels: str) -> float:
        return next(s.value for s in fams[name].samples if s.labels == labels and s.name.endswith("_total")
                    or s.labels == labels and name == s.name)

    assert value("whywait_agent_collector_runs", collector="host") >= 3
    assert value("whywait_agent_collector_seconds", collector="host") > 0
    assert value("whywait_agent_collector_errors", collector="storage") == broken.errors
    assert value("whywait_agent_collector_off", collector="storage") == (1 if broken.off_reason else 0)
    assert broken.errors or broken.off_reason  # the point of the broken collector: something must show
    assert value("whywait_agent_messages_published") == agent.publisher.sent >= 3
    assert value("whywait_agent_messages_failed", reason="dropped") == 0
    assert value("whywait_agent_buffered_messages") == 0


def test_json_log_lines_carry_time_level_logger_message_and_extra_fields() -> None:
    rec = logging.LogRecord("whywait.engine", logging.WARNING, __file__, 1, "lag %d on %s", (12, "net-0"), None)
    rec.partition = 3  # what logger.warning(..., extra={"partition": 3}) sets
    try:
        raise ValueError("boom")
    except ValueError:
        rec.exc_info = sys.exc_info()
    line = JsonFormatter().format(rec)
    assert "\n" not in line  # one event, one line, traceback included
    d = json.loads(line)
    assert d["level"] == "warning" and d["logger"] == "whywait.engine" and d["message"] == "lag 12 on net-0"
    assert d["partition"] == 3 and d["time"].endswith("Z") and "ValueError: boom" in d["exc"]
    assert "args" not in d and "msg" not in d  # the record's own attributes are not repeated


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "whywait", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env={**os.environ, **(env or {})})


def test_json_logs_from_the_real_cli() -> None:
    # `kafka status` against a dead port logs nothing useful; the agent's one-shot print logs its collectors
    r = run("--log-format", "json", "agent", "--print", "--rounds", "1", "--interval", "0.05",
            "--collectors", "host,storage", "--root", "/nonexistent-root", "--socket", "none")
    lines = [json.loads(x) for x in r.stderr.splitlines() if x.strip()]
    assert lines, r.stderr
    assert all({"time", "level", "logger", "message"} <= set(d) for d in lines), r.stderr


def test_bad_metrics_addr_and_log_format_are_one_line() -> None:
    r = run("engine", "--metrics-addr", "9464", "--bootstrap", "127.0.0.1:1")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "whywait engine: --metrics-addr must be HOST:PORT like 127.0.0.1:9464 or :9464 (got '9464')"], r.stderr
    r = run("agent", "--print", "--rounds", "1", "--socket", "none", env={"WHYWAIT_METRICS_ADDR": "x:y"})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "whywait agent: $WHYWAIT_METRICS_ADDR must be HOST:PORT like 127.0.0.1:9464 or :9464 (got 'x:y')"], r.stderr
    r = run("rules", "metrics", env={"WHYWAIT_LOG_FORMAT": "xml"})
    assert r.returncode == 2 and "WHYWAIT_LOG_FORMAT must be one of text, json (got 'xml')" in r.stderr


def test_agent_cli_serves_metrics_while_it_runs() -> None:
    import os
    import socket
    import time
    import urllib.error

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "whywait", "agent", "--print", "--rounds", "20", "--interval",
                             "0.2", "--collectors", "host", "--socket", "none", "--metrics-addr", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=os.environ)
    text, ready = "", ""
    try:
        deadline = time.time() + 30
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    ready = r.read().decode()
                if "whywait_agent_messages_published_total 0.0" not in text:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(30)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["whywait_agent_messages_published"].samples[0].value >= 1, (text, proc.stderr and proc.stderr.read())
    assert ready == "ready\n"  # printing: no broker to wait for
