"""``strict`` rule-test cases: what counts against them, scored as ``whywait eval`` scores it."""

from __future__ import annotations

from typing import Any

import pytest
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.rules.loader import load_rules
from whywait.simulate import ruletest
from whywait.simulate.ruletest import START, run_case

EVENTS = [{"at": 0, "kind": "placement", "node": "sched", "job": "j", "project": "p", "team": "t",
           "state": "running", "ranks": [{"rank": 0, "node": "node-01", "gpu": 0}]}]


def _diag(rule: str, status: str, at: float, **labels: str) -> Diagnosis:
    return Diagnosis(rule_id=rule, fingerprint=f"{rule}|j", status=status, severity="info",  # type: ignore[arg-type]
                     title=rule, cause="", job="j", owner=None, starts_at=START + at, detected_at=START + at,
                     labels=dict(labels))


class _Scripted:
    """Stands in for the Evaluator: the diagnoses of a slowdown told as the whole job's, then taken over."""

    said: list[Diagnosis] = []

    def __init__(self, *_: Any) -> None:
        self.store = type("S", (), {"max_time": START})()

    def ingest(self, _m: Any) -> list[Diagnosis]:
        return []

    def advance(self, _now: float) -> list[Diagnosis]:
        return list(self.said)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[_Scripted]:
    monkeypatch.setattr(ruletest, "Evaluator", _Scripted)
    return _Scripted


def _case(expect: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "c", "_where": "x.test.yaml:1", "events": EVENTS, "topology": {"cluster": {"nodes": 1}},
            "expect": expect}


def test_an_incident_a_later_one_took_over_does_not_count_against_strict(scripted: type[_Scripted]) -> None:
    scripted.said = [_diag("job.whole-job-slow", "firing", 10),
                     _diag("job.whole-job-slow", "resolved", 70, superseded_by="job.periodic-slowdown"),
                     _diag("job.periodic-slowdown", "firing", 70)]
    res = run_case(load_rules(["rules"]), _case([{"rule": "job.periodic-slowdown"}]))
    assert res.failures == []


def test_an_incident_nobody_took_over_still_fails_strict(scripted: type[_Scripted]) -> None:
    scripted.said = [_diag("job.whole-job-slow", "firing", 10), _diag("job.whole-job-slow", "resolved", 70),
                     _diag("job.periodic-slowdown", "firing", 70)]
    res = run_case(load_rules(["rules"]), _case([{"rule": "job.periodic-slowdown"}]))
    assert len(res.failures) == 1 and "unexpected job.whole-job-slow (firing)" in res.failures[0], res.failures
