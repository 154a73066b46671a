"""The shipped rule library: it loads, every rule has test cases, and every case passes.

Each case of each ``rules/**/<id>.test.yaml`` is its own test (``test_case[<file>::<name>]``),
run through :func:`whywait.simulate.ruletest.run_case`, the same evaluator as production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from whywait.engine.rules.loader import RuleSet, load_rules
from whywait.simulate.ruletest import find_test_files, load_cases, run_case, untested_rules

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"


def _cases() -> list[Any]:
    out = []
    for f in find_test_files([RULES_DIR]):
        _, cases = load_cases(f)
        for c in cases:
            out.append(pytest.param(f, c, id=f"{f.stem.removesuffix('.test')}::{c['name']}"))
    return out


@pytest.fixture(scope="module")
def shipped() -> RuleSet:
    return load_rules([RULES_DIR])


def test_shipped_rules_load(shipped: RuleSet) -> None:
    assert len(shipped) >= 17


def test_every_shipped_rule_has_cases(shipped: RuleSet) -> None:
    assert untested_rules(shipped, [RULES_DIR]) == []


def test_every_rule_names_its_cause_runbook_and_layer(shipped: RuleSet) -> None:
    for rule in shipped:
        assert rule.labels.get("cause"), f"{rule.id}: labels.cause names the fault cause it explains"
        assert rule.runbook_url and rule.runbook_url.endswith(".md"), rule.id
        runbook = RULES_DIR.parent / "docs" / "runbooks" / rule.runbook_url.rsplit("/", 1)[1]
        assert runbook.exists(), f"{rule.id}: {runbook} is missing"


def test_whole_job_slow_is_muted_by_every_specific_cause(shipped: RuleSet) -> None:
    muters = {r.id for r in shipped if "job.whole-job-slow" in r.inhibits}
    # A clock that is off slows nothing (step times do not depend on it), nor does an agent that stopped on
    # a node that trains on: neither may mute a slowdown of the whole job, which it would, for a job-wide
    # finding blames no node.
    assert muters == set(shipped.rules) - {"job.whole-job-slow", "job.node-clock-skew", "job.node-unseen"}


@pytest.mark.parametrize(("file", "case"), _cases())
def test_case(shipped: RuleSet, file: Path, case: dict[str, Any]) -> None:
    res = run_case(shipped, case, str(file))
    assert res.ok, "\n".join(res.failures)
