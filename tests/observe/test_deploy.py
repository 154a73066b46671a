"""The shipped Grafana dashboard and Prometheus alert rules: they parse, and every metric they query is one whywait
exports (engine names against :data:`METRIC_NAMES`, agent names against a real agent's scrape).

``tests/integration/test_metrics.py`` checks the same names against a running engine's /metrics.  ``promtool check
rules`` and ``promtool test rules`` run with the promtool on PATH, else one built once with Go into
``~/.cache/whywait/promtool/`` (:mod:`tests.support.promtool`); they skip only without Go.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from whywait.agents.agent import Agent
from whywait.agents.collectors import HostCollector
from whywait.agents.observe import agent_registry
from whywait.agents.publisher import MemoryPublisher
from whywait.engine.observe.metrics import METRIC_NAMES

from tests.support.promtool import promtool_binary

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "whywait.json"
ALERTS = REPO / "deploy" / "prometheus" / "whywait-alerts.yaml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "whywait-alerts.test.yaml"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def dashboard_exprs(path: Path) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets, nested rows, and query variables."""
    dash = json.loads(path.read_text())
    out: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", ()) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", ()):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append(q)
    return out


def alert_exprs(path: Path) -> list[str]:
    """Every rule's ``expr`` in the alert rules file."""
    return [r["expr"] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def metric_names(exprs: list[str]) -> set[str]:
    """The whywait metric names the expressions read (``up`` and PromQL functions are not ours)."""
    return {m for e in exprs for m in re.findall(r"\bwhywait_[a-z_]+\b", e)}


def engine_names() -> set[str]:
    """Every sample name the engine's families can produce."""
    out = set(METRIC_NAMES)
    out |= {n + s for n in METRIC_NAMES if n.endswith("_seconds") and "duration" in n for s in HISTOGRAM_SUFFIXES}
    return out


def agent_names() -> set[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:  # with a training socket: its gauge is exported only then
        agent = Agent("node-01", [HostCollector("/")], MemoryPublisher(), interval=0.01,
                      socket_path=f"{d}/agent.sock")
        asyncio.run(agent.run(rounds=1))
        text = generate_latest(agent_registry(agent)).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_dashboard_parses_and_queries_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))  # Grafana keys panels by id
    used = metric_names(dashboard_exprs(DASHBOARD))
    assert used - engine_names() - agent_names() == set()
    # the dashboard shows what the issue asks to watch
    for name in ("whywait_engine_consumer_lag", "whywait_engine_events_total", "whywait_engine_dead_letters_total",
                 "whywait_engine_tick_duration_seconds_bucket", "whywait_engine_diagnoses_fired_total",
                 "whywait_notifications_total", "whywait_engine_rule_reload_failures_total",
                 "whywait_agent_buffered_messages"):
        assert name in used, name


def test_alert_rules_parse_and_cover_whywaits_own_health() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    for r in rules:
        assert set(r) <= ALERT_KEYS and r["alert"] and r["expr"], r
        assert r["labels"]["severity"] in ("critical", "warning", "info")
        assert r["annotations"]["summary"]
    assert metric_names(alert_exprs(ALERTS)) - engine_names() - agent_names() == set()
    names = {r["alert"] for r in rules}
    for wanted in ("WhywaitEngineDown", "WhywaitConsumerLagGrowing", "WhywaitDeadLettersRising",
                   "WhywaitNotificationsFailing", "WhywaitRuleReloadFailing", "WhywaitTickSlowerThanInterval",
                   "WhywaitBrokerUnreachable"):
        assert wanted in names


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool from PATH, else the cached build (built now when missing: minutes, once); skips only without Go."""
    try:
        return str(promtool_binary())
    except FileNotFoundError as e:  # neither a promtool nor Go; a failed build is an error, not a skip
        pytest.skip(str(e))


def run_promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_and_unit_tests_the_alert_rules(promtool: str) -> None:
    r = run_promtool(promtool, "check", "rules", str(ALERTS))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 18 rules found" in r.stdout, r.stdout
    # and the alerts fire on the series they are written for (and not on healthy ones): promtool's unit tests
    r = run_promtool(promtool, "test", "rules", str(ALERT_TESTS))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # every shipped alert has a unit test that sees it fire and one that sees it stay quiet
    rules = [rule["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for rule in g["rules"]]
    evals = [e for t in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for e in t["alert_rule_test"]]
    for name in rules:
        assert any(e["alertname"] == name and e["exp_alerts"] for e in evals), f"{name}: no test sees it fire"
        assert any(e["alertname"] == name and not e["exp_alerts"] for e in evals), f"{name}: no test sees it quiet"


def test_the_alert_unit_tests_fail_when_an_alert_cannot_fire(promtool: str, tmp_path: Path) -> None:
    """The unit tests are not vacuous: with any one alert's expression replaced by one that never matches,
    ``promtool test rules`` fails (each alert's firing case really depends on its expression)."""
    (tmp_path / ALERT_TESTS.name).write_text(ALERT_TESTS.read_text())
    doc = yaml.safe_load(ALERTS.read_text())
    names = [r["alert"] for g in doc["groups"] for r in g["rules"]]
    for name in names:
        broken = yaml.safe_load(ALERTS.read_text())
        for g in broken["groups"]:
            for rule in g["rules"]:
                if rule["alert"] == name:
                    rule["expr"] = "vector(1) == 0"
        (tmp_path / ALERTS.name).write_text(yaml.safe_dump(broken, sort_keys=False))
        r = run_promtool(promtool, "test", "rules", str(tmp_path / ALERT_TESTS.name))
        assert r.returncode != 0, f"{name}: the unit tests still pass with an alert that never fires"
        assert name in r.stdout + r.stderr, r.stdout + r.stderr
