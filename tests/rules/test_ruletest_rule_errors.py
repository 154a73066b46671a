"""A rule that raised, or a text that failed to render, during a case fails the case: one line naming the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.ruletest import load_cases, run_case

RULES = Path(__file__).resolve().parents[2] / "rules"
RULE = RULES / "checkpoint" / "checkpoint.failed.yaml"
TESTS = RULES / "checkpoint" / "checkpoint.failed.test.yaml"


def _rule(tmp_path: Path, title_extra: str = "") -> Path:
    """checkpoint.failed alone (without the rules it inhibits), its title prefixed by ``title_extra``."""
    text = "".join(ln for ln in RULE.read_text().splitlines(keepends=True) if not ln.startswith("inhibits:"))
    assert 'title: "{{ job }} cannot save' in text
    f = tmp_path / RULE.name
    f.write_text(text.replace('title: "{{ job }} cannot save', f'title: "{{{{ job }}}} {title_extra}cannot save'))
    return f


def test_the_unbroken_rule_passes_its_first_case(tmp_path: Path) -> None:
    rules = load_rules([_rule(tmp_path)])
    res = run_case(rules, load_cases(TESTS, rules.rules.keys())[1][0], str(TESTS))
    assert res.failures == []


def test_a_rule_that_raised_during_the_case_fails_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Evaluator._tick_rule

    def tick_rule(self: Evaluator, rule: Any, *args: Any) -> None:
        if rule.id == "checkpoint.failed" and self.store.max_time > 0:
            raise ValueError("boom")
        real(self, rule, *args)

    monkeypatch.setattr(Evaluator, "_tick_rule", tick_rule)
    rules = load_rules([_rule(tmp_path)])
    res = run_case(rules, load_cases(TESTS, rules.rules.keys())[1][1], str(TESTS))  # strict: false, absent
    assert not res.ok
    (line,) = [f for f in res.failures if "raised" in f]
    assert "\n" not in line
    assert "checkpoint.failed.test.yaml:" in line and "rule checkpoint.failed raised on " in line
    assert line.endswith("ValueError: boom")


def test_a_template_that_failed_to_render_fails_the_case(tmp_path: Path) -> None:
    rule = _rule(tmp_path, "{{ 1 / 0 }} ")
    rules = load_rules([rule])
    res = run_case(rules, load_cases(TESTS, rules.rules.keys())[1][0], str(TESTS))
    assert res.diagnoses and not res.ok
    (line,) = res.failures
    assert "\n" not in line
    assert f"{rule}:" in line and "rule 'checkpoint.failed': 'title' template failed to render: " in line
    assert line.endswith("ZeroDivisionError: division by zero")
