"""Rules, their tests and macros named ``*.yml`` are loaded like ``*.yaml``: a folder of them is not "0 rule(s) OK"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.engine.rules.loader import load_rules
from whywait.engine.rules.reload import RuleReloader
from whywait.simulate.ruletest import find_test_files, untested_rules

from tests.rules.test_rules_cmd import RULE, TEST

MACROS = "macros:\n  cpu-hot: {type: threshold, metric: host.cpu_busy_pct, agg: max, window: 5s, value: \"> 95\"," \
         " culprit: true}\n"


def yml_site(tmp_path: Path) -> Path:
    d = tmp_path / "site-rules"
    d.mkdir()
    (d / "macros.yml").write_text(MACROS)
    (d / "site.cpu-hot.yml").write_text(RULE.replace(
        'when: {type: threshold, metric: host.cpu_busy_pct, agg: max, window: 5s, value: "> 95", culprit: true}',
        "when: {macro: cpu-hot}"))
    (d / "site.cpu-hot.test.yml").write_text(TEST.replace("@CULPRIT@", "node-02"))
    return d


def test_a_folder_of_yml_rules_tests_and_macros_is_loaded(tmp_path: Path) -> None:
    d = yml_site(tmp_path)
    rules = load_rules([d])
    assert list(rules.rules) == ["site.cpu-hot"]
    assert find_test_files([d]) == [d / "site.cpu-hot.test.yml"]
    assert untested_rules(rules, [d]) == []


def test_rules_check_and_test_count_yml_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = yml_site(tmp_path)
    assert main(["rules", "check", str(d)]) == 0
    assert "1 rule(s) and 1 test file(s) OK" in capsys.readouterr().err
    assert main(["rules", "test", str(d), "--require-all"]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out


def test_reload_sees_an_edited_yml_rule(tmp_path: Path) -> None:
    d = yml_site(tmp_path)
    r = RuleReloader([d])
    f = d / "site.cpu-hot.yml"
    f.write_text(f.read_text() + "severity: critical\n")
    st = f.stat()
    os.utime(f, (st.st_atime, st.st_mtime + 5))
    res = r.poll()
    assert res is not None and res.ok and res.rules is not None
    assert res.rules.rules["site.cpu-hot"].severity == "critical"
