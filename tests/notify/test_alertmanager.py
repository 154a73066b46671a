"""The Alertmanager receiver against a real Alertmanager (v0.28.1, built from its Go module once and cached)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from whywait.engine.notify.pipeline import Pipeline, PipelineConfig
from whywait.engine.notify.receivers.alertmanager import AlertmanagerReceiver, label_name

from tests.notify.conftest import T0
from tests.support.alertmanager import NO_GO, Alertmanager, NotificationSink, cache_dir, go_available

FAST = PipelineConfig(group_wait=0.1, group_interval=0.2, retry_backoff=(0.05, 0.2))


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[Alertmanager, NotificationSink]]:
    """A running Alertmanager whose one receiver is a webhook to a sink in this test (built first if need be)."""
    with NotificationSink() as sink, Alertmanager(sink.url, workdir=tmp_path / "am") as am:
        yield am, sink


# Skipped only where Go is absent and no binary was cached before; a failing build is an error.
pytestmark = pytest.mark.skipif(not go_available() and not (cache_dir() / "alertmanager").is_file(), reason=NO_GO)


def _by_node(alerts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["labels"]["node"]: a for a in alerts}


def test_incident_fires_and_resolves_in_alertmanager(alertmanager: Any, make_diagnosis: Any) -> None:
    am, sink = alertmanager
    d7, d8 = make_diagnosis(rank=12, node="node-07"), make_diagnosis(rank=13, node="node-08")
    d7 = dataclasses.replace(d7, labels={**d7.labels, "cause": "network.packet-loss"})
    with Pipeline([AlertmanagerReceiver(am.url, dashboard_url_template="https://grafana/d/x?var-job={job}")],
                  FAST) as p:
        p.notify(d7)
        p.notify(d8)
        assert p.flush(10)
        alerts = _by_node(am.wait_alerts(lambda a: len(a) == 2))
        a = alerts["node-07"]
        assert a["labels"] == {"alertname": "network.straggler-retransmits", "job": "llm-70b",
                               "project": "llm-pretrain", "team": "ml-infra", "node": "node-07",
                               "severity": "warning", "cause": "network.packet-loss", "switch": "leaf-3"}
        ann = a["annotations"]
        assert ann["summary"] == d7.title and ann["description"] == d7.cause
        assert ann["runbook_url"] == "https://runbooks.example/network/straggler-retransmits"
        assert ann["dashboard_url"] == "https://grafana/d/x?var-job=llm-70b" and ann["ranks"] == "12"
        assert a["status"]["state"] == "active" and a["startsAt"].startswith("2025-06-15T15:06:40")
        assert a["generatorURL"] == "https://grafana/d/x?var-job=llm-70b"
        assert ann["incident"] == alerts["node-08"]["annotations"]["incident"]  # one whywait incident
        firing = sink.wait_for(lambda n: n["status"] == "firing")
        assert len(firing["alerts"]) == 2 and firing["commonLabels"]["alertname"] == "network.straggler-retransmits"

        # one finding clears: that alert resolves, the other keeps firing
        p.notify(dataclasses.replace(d8, status="resolved", ends_at=T0 + 600))
        assert p.flush(10)
        assert list(_by_node(am.wait_alerts(lambda a: len(a) == 1))) == ["node-07"]
        # the whole incident clears: Alertmanager lists nothing and notifies the resolution itself
        p.notify(dataclasses.replace(d7, status="resolved", ends_at=T0 + 900))
        assert p.flush(10)
        assert am.wait_alerts(lambda a: a == []) == []
        resolved = sink.wait_for(lambda n: n["status"] == "resolved" and len(n["alerts"]) == 2)
        assert {x["labels"]["node"] for x in resolved["alerts"]} == {"node-07", "node-08"}
        assert all(x["status"] == "resolved" for x in resolved["alerts"])
        s = p.stats()["receivers"]["alertmanager"]
    assert s["failed"] == 0 and s["replied"] == 0  # news replies are for people; Alertmanager gets the state


def test_firing_alert_is_refreshed_before_resolve_timeout(alertmanager: Any, make_diagnosis: Any) -> None:
    am, _ = alertmanager
    with Pipeline([AlertmanagerReceiver(am.url, refresh_interval=0.5)], FAST) as p:
        p.notify(make_diagnosis())
        assert p.flush(10)
        first = am.wait_alerts(lambda a: len(a) == 1)[0]["updatedAt"]
        time.sleep(1.5)
        again = am.alerts()
        assert len(again) == 1 and again[0]["updatedAt"] > first  # re-sent while it fires
        assert p.stats()["receivers"]["alertmanager"]["updated"] >= 2


def test_raised_severity_resolves_the_old_alert(alertmanager: Any, make_diagnosis: Any) -> None:
    """Severity is part of an alert's identity: when it changes, the old alert is resolved at once."""
    am, _ = alertmanager
    with Pipeline([AlertmanagerReceiver(am.url)], FAST) as p:
        d = make_diagnosis()
        p.notify(d)
        assert p.flush(10)
        assert [a["labels"]["severity"] for a in am.wait_alerts(lambda a: len(a) == 1)] == ["warning"]
        time.sleep(0.25)  # past group_interval: the raise is news
        p.notify(dataclasses.replace(d, severity="critical"))
        assert p.flush(10)
        after = am.wait_alerts(lambda a: [x["labels"]["severity"] for x in a] == ["critical"])
    assert len(after) == 1


def test_unreachable_alertmanager_is_retried_then_delivered(tmp_path: Path, make_diagnosis: Any) -> None:
    from tests.support.alertmanager import free_port

    port = free_port()
    with Pipeline([AlertmanagerReceiver(f"http://127.0.0.1:{port}", timeout=1.0)], FAST) as p:
        p.notify(make_diagnosis())
        assert not p.flush(1.0)
        assert p.stats()["receivers"]["alertmanager"]["retried"] >= 1
        with NotificationSink() as sink:
            am = Alertmanager(sink.url, workdir=tmp_path / "am")
            am.port, am.url = port, f"http://127.0.0.1:{port}"  # comes up where whywait was told it is
            with am:
                assert p.flush(15)
                assert len(am.alerts()) == 1


def test_label_names_are_made_valid() -> None:
    assert [label_name(n) for n in ("gpu.model", "9lives", "ok_name", "a-b")] == ["gpu_model", "_9lives", "ok_name",
                                                                                 "a_b"]
