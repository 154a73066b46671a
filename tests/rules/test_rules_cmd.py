"""``whywait rules check`` and ``whywait rules test``: the rules under test come from the paths given,
test files are checked as strictly as rules, and results can be written as JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from whywait.engine.cli import main

RULES = Path(__file__).resolve().parents[2] / "rules"

RULE = """\
apiVersion: whywait/v1
id: site.cpu-hot
title: "{{ job }} waits on {{ node }}: CPU saturated"
cause: "{{ node }} is {{ ev['host.cpu_busy_pct'].value | num }}% busy"
next_step: "look at {{ node }}"
group_by: [job, node]
when: {type: threshold, metric: host.cpu_busy_pct, agg: max, window: 5s, value: "> 95", culprit: true}
"""

TEST = """\
rule: site.cpu-hot
cases:
- name: node-02 is saturated
  topology: {cluster: {nodes: 2}}
  events:
  - {at: 0, kind: placement, node: sched, job: train, project: llm, team: ml, state: running,
     ranks: [{rank: 0, node: node-01, gpu: 0}, {rank: 1, node: node-02, gpu: 0}]}
  - {at: 1, kind: host, node: node-02, cpu_busy_pct: 99.0, cpu_iowait_pct: 0.0,
     mem_used_bytes: 1000, mem_total_bytes: 4000}
  expect:
  - {rule: site.cpu-hot, culprit: @CULPRIT@, detected: [1s, 3s]}
"""


def site(tmp_path: Path, culprit: str = "node-02", test: str | None = None) -> Path:
    d = tmp_path / "site-rules"
    d.mkdir()
    (d / "site.cpu-hot.yaml").write_text(RULE)
    (d / "site.cpu-hot.test.yaml").write_text(test if test is not None else TEST.replace("@CULPRIT@", culprit))
    return d


def test_rules_test_loads_the_rules_from_the_folder_it_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    monkeypatch.chdir(RULES.parent)  # ./rules exists here and does not hold site.cpu-hot
    assert main(["rules", "test", str(d)]) == 0
    out = capsys.readouterr().out
    assert f"PASS  {d}/site.cpu-hot.test.yaml: node-02 is saturated" in out and "1 passed, 0 failed" in out


def test_a_test_file_given_alone_loads_the_rule_it_is_named_after(tmp_path: Path) -> None:
    d = site(tmp_path)
    assert main(["rules", "test", str(d / "site.cpu-hot.test.yaml")]) == 0


def test_junit_xml_holds_each_case_and_its_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path, culprit="node-01")
    report = tmp_path / "junit.xml"
    assert main(["rules", "test", str(d), "--junit", str(report)]) == 1
    root = ET.parse(report).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "1" and root.get("failures") == "1"
    (case,) = root.iter("testcase")
    assert case.get("name") == "node-02 is saturated" and case.get("classname") == f"{d}/site.cpu-hot.test.yaml"
    failure = case.find("failure")
    assert failure is not None and (failure.text or "").startswith(
        f"{d}/site.cpu-hot.test.yaml:11: cases[0].expect[0]: expected status=firing rule=site.cpu-hot culprit=node-01")
    assert "FAIL" in capsys.readouterr().out


def test_passing_junit_has_no_failure(tmp_path: Path) -> None:
    d = site(tmp_path)
    report = tmp_path / "junit.xml"
    assert main(["rules", "test", str(d), "--junit", str(report)]) == 0
    root = ET.parse(report).getroot()
    assert root.get("failures") == "0" and [c.find("failure") for c in root.iter("testcase")] == [None]


def test_rules_flag_brings_the_shipped_rules_a_site_overrides(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "site-rules"
    d.mkdir()
    (d / "critical-gids.yaml").write_text("override: hardware.rdma-gid-missing\nseverity: critical\n")
    shipped_case = (RULES / "hardware" / "hardware.rdma-gid-missing.test.yaml").read_text()
    (d / "critical-gids.test.yaml").write_text(
        shipped_case.replace("    culprit: node-02\n", "    culprit: node-02\n    severity: critical\n", 1))
    assert main(["rules", "test", str(d), "--rules", str(RULES)]) == 0
    capsys.readouterr()
    # Without the shipped rules, the override names nothing: one line, no traceback, exit 1 (as `rules check`).
    assert main(["rules", "test", str(d)]) == 1
    err = capsys.readouterr().err
    assert "critical-gids.yaml:1: 'override' must name a rule loaded before it (got 'hardware.rdma-gid-missing')" \
        in err and "Traceback" not in err


def test_a_missing_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "test", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err == f"whywait rules: {tmp_path / 'nope'}: no such file or folder\n"
    assert main(["rules", "test", str(site(tmp_path)), "--rules", str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == f"whywait rules: {tmp_path / 'gone'}: no such file or folder\n"


BAD_SCENARIO = """\
rule: site.cpu-hot
cases:
- name: a typo in the fault name
  scenario:
    cluster: {nodes: 4}
    duration_s: 60
    faults:
    - {fault: nic-packet-los, target: node-02, start: 10, end: 50}
  expect:
  - {rule: site.cpu-hot, culprit: node-02}
  - {rule: site.cpu-hto, culprti: node-02, detected: [10s, 2x]}
"""


def test_check_refuses_a_bad_test_file_with_every_problem_and_its_line(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path, test=BAD_SCENARIO)
    f = d / "site.cpu-hot.test.yaml"
    assert main(["rules", "check", str(d)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{f}:8: cases[0].scenario.faults[0]: unknown fault 'nic-packet-los' (valid: ")
    assert out[1:] == [
        f"{f}:11: cases[0].expect[1].rule: must name a loaded rule (got 'site.cpu-hto'); load the folder that holds it "
        "too",
        f"{f}:11: cases[0].expect[1].culprti: is not a diagnosis field (valid: absent, cause, clean_checks, "
        "confidence, cost, culprit, detected, detected_at, ends_at, evidence, fingerprint, job, labels, "
        "message_contains, next_step, "
        "owner, ranks, rule, rule_id, runbook_url, severity, starts_at, status, text, text_contains, title, "
        "topology_path)",
        f"{f}:11: cases[0].expect[1].detected[1]: must be a duration like '60s' (units ms, s, m, h, d, w) "
        "or a number of seconds (got '2x')",
    ]


def test_rules_test_refuses_the_same_file_before_running_anything(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path, test=BAD_SCENARIO)
    assert main(["rules", "test", str(d)]) == 1  # as `rules check` exits on the same file
    err = capsys.readouterr().err
    assert err.startswith("whywait rules: 4 problems:\n") and "unknown fault 'nic-packet-los'" in err
    assert "Traceback" not in err


def test_check_of_the_shipped_rules_counts_their_tests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "check", str(RULES)]) == 0
    n_tests = len(list(RULES.rglob("*.test.yaml")))
    assert f"rule(s) and {n_tests} test file(s) OK" in capsys.readouterr().err


def test_check_of_a_missing_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "check", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"whywait rules: {tmp_path / 'nope'}: no such file or folder\n"


def test_a_sub_folder_without_its_macros_says_how_to_load_them(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    # `whywait rules test rules/job` loads no macros.yaml (it sits one folder up): every macro a rule names
    # is then unknown, and the line must say how to load them rather than only that none is defined.
    # (`rules check rules/job` now loads the rest of its tree, as `rules test` does: a copy out of it has none)
    import shutil

    alone = tmp_path / "job"
    shutil.copytree(RULES / "job", alone)
    assert main(["rules", "check", str(alone)]) != 0
    got = capsys.readouterr()
    err = got.out + got.err
    assert "job.straggler.yaml:" in err and "load the folder holding macros.yaml too, e.g. --rules rules" in err


def rules_tree(tmp_path: Path) -> Path:
    """A site's rules tree like the shipped one: macros.yaml at its root, rules in sub-folders that refer to
    each other (a macro, an inhibition)."""
    tree = tmp_path / "tree"
    (tree / "host").mkdir(parents=True)
    (tree / "other").mkdir()
    (tree / "macros.yaml").write_text("macros:\n  cpu-hot: {type: threshold, metric: host.cpu_busy_pct, agg: max, "
                                      "window: 5s, value: \"> 95\", culprit: true}\n")
    (tree / "host" / "site.cpu-hot.yaml").write_text(
        RULE.replace("when: {type: threshold, metric: host.cpu_busy_pct, agg: max, window: 5s, value: \"> 95\", "
                     "culprit: true}", "when: {macro: cpu-hot}\ninhibits: [site.cpu-cold]"))
    (tree / "host" / "site.cpu-hot.test.yaml").write_text(TEST.replace("@CULPRIT@", "node-02"))
    (tree / "other" / "site.cpu-cold.yaml").write_text(
        RULE.replace("site.cpu-hot", "site.cpu-cold").replace('"> 95"', '"< 1"'))
    return tree


def test_a_folder_inside_a_rules_tree_is_tested_with_the_rest_of_the_tree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`rules test rules/network` failed with 10 errors (its macros and the rules it inhibits are elsewhere in
    rules/) although the README says it tests a folder against its own rules."""
    tree = rules_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    for given in ("tree/host", "tree/host/site.cpu-hot.test.yaml"):
        assert main(["rules", "test", given]) == 0, capsys.readouterr()
        out, err = capsys.readouterr()
        assert "PASS  " in out and "1 passed, 0 failed" in out
        assert err == (f"rules test: {given} lies in the rules tree tree/: loading its other rules too, for the "
                       "macros and rules it refers to (--rules to choose others)\n"
                       "rules test: running 1 case(s) from 1 test file(s)\n")
    # the tree given with --rules, or as a path, is not loaded twice nor announced
    assert main(["rules", "test", "tree/host", "--rules", str(tree)]) == 0
    assert main(["rules", "test", "tree", "tree/host"]) == 0
    assert "lies in the rules tree" not in capsys.readouterr().err


def test_a_rule_named_but_not_loaded_says_how_to_load_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = rules_tree(tmp_path)
    (tree / "macros.yaml").unlink()  # no longer a tree: nothing is loaded from above
    (tree / "host" / "site.cpu-hot.yaml").write_text(RULE + "inhibits: [site.cpu-cold]\n")
    assert main(["rules", "test", str(tree / "host")]) == 1
    assert capsys.readouterr().err.endswith(
        "rule 'site.cpu-hot': 'inhibits[0]' must name a loaded rule (got 'site.cpu-cold'); load the folder that "
        "holds it too, e.g. --rules rules\n")
