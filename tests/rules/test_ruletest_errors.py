"""Malformed rule-test files are refused with their file and place, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.rules.loader import load_rules
from whywait.simulate.ruletest import RuleTestError, load_cases, run_case

RULES = Path(__file__).resolve().parents[2] / "rules"


def test_a_merge_key_is_refused_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "x.test.yaml"
    f.write_text("base: &b {seed: 1}\ncases:\n- name: c\n  scenario:\n    <<: *b\n    duration_s: 10\n  expect: []\n")
    with pytest.raises(RuleTestError, match=r"x\.test\.yaml:5: .*merge key"):
        load_cases(f)


def test_a_duplicate_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    f = tmp_path / "x.test.yaml"
    f.write_text("cases:\n- name: c\n  name: d\n  events: []\n  expect: []\n")
    with pytest.raises(RuleTestError, match=r"x\.test\.yaml:3: .*duplicate key 'name' \(the first is on line 2\)"):
        load_cases(f)


def test_an_event_that_breaks_the_contract_names_its_case(tmp_path: Path) -> None:
    f = tmp_path / "x.test.yaml"
    f.write_text("cases:\n- name: c\n  events:\n  - {at: 0, kind: steps, job: j, steps: [{rank: 0}]}\n  expect: []\n")
    _, cases = load_cases(f)
    with pytest.raises(RuleTestError, match=r"events\[0\]: breaks the event contract: steps\[0\]\.step: is required"):
        run_case(load_rules([RULES]), cases[0], str(f))


def test_a_missing_test_path_is_one_line(tmp_path: Path) -> None:
    from whywait.simulate.ruletest import find_test_files

    with pytest.raises(RuleTestError, match=r"nope: no such file or folder"):
        find_test_files([tmp_path / "nope"])


def test_eval_refuses_an_unknown_class_rather_than_running_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.cli import main

    assert main(["eval", "--only", "nosuch"]) == 2
    assert "unknown fault class(es) nosuch" in capsys.readouterr().err
