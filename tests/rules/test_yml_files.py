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


def test_a_yml_test_file_given_alone_loads_the_rule_it_is_named_after(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    d = yml_site(tmp_path)
    (d / "site.cpu-hot.yml").write_text(RULE)  # no macro: the rule alone, without the folder's macros.yml
    assert main(["rules", "test", str(d / "site.cpu-hot.test.yml")]) == 0, capsys.readouterr()
    assert "1 passed, 0 failed" in capsys.readouterr().out


def test_rules_check_checks_a_yml_test_file_given_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = yml_site(tmp_path)
    f = d / "site.cpu-hot.test.yml"
    assert main(["rules", "check", str(f)]) == 0
    assert "0 rule(s) and 1 test file(s) OK" in capsys.readouterr().err
    f.write_text(f.read_text().replace("- name: node-02 is saturated", "- name: node-02 is saturated\n  bogus: 1"))
    assert main(["rules", "check", str(f)]) == 1
    assert f"{f}:4: cases[0].bogus: is not a case key" in capsys.readouterr().out


def test_a_folder_inside_a_tree_with_macros_yml_is_tested_with_the_rest_of_the_tree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    tree = yml_site(tmp_path)
    (tree / "host").mkdir()
    for f in ("site.cpu-hot.yml", "site.cpu-hot.test.yml"):
        (tree / f).rename(tree / "host" / f)
    monkeypatch.chdir(tmp_path)
    assert main(["rules", "test", "site-rules/host"]) == 0, capsys.readouterr()
    out, err = capsys.readouterr()
    assert "1 passed, 0 failed" in out
    assert err.startswith("rules test: site-rules/host lies in the rules tree site-rules/: loading its other rules")
