"""``whywait rules check`` and ``rules test`` as a rule author and a hostile user meet them: ``--show`` prints the
message each case's alert would send; both exit alike (1: the rules or tests are wrong, 2: the command line is);
every wrong input is one line naming the file (and line), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.cli import main

RULE = """\
apiVersion: whywait/v1
id: site.cpu-hot
title: "{{ job }} waits on {{ node }}: CPU saturated"
cause: "{{ node }} is {{ ev['host.cpu_busy_pct'].value | num }}% busy"
next_step: "look at {{ node }}'s top processes"
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
- name: a quiet node raises nothing
  topology: {cluster: {nodes: 2}}
  events:
  - {at: 0, kind: placement, node: sched, job: train, project: llm, team: ml, state: running,
     ranks: [{rank: 0, node: node-01, gpu: 0}, {rank: 1, node: node-02, gpu: 0}]}
  - {at: 1, kind: host, node: node-02, cpu_busy_pct: 10.0, cpu_iowait_pct: 0.0,
     mem_used_bytes: 1000, mem_total_bytes: 4000}
  expect: []
"""


def site(tmp_path: Path, culprit: str = "node-02", rule: str = RULE, name: str = "site-rules") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "site.cpu-hot.yaml").write_text(rule)
    (d / "site.cpu-hot.test.yaml").write_text(TEST.replace("@CULPRIT@", culprit))
    return d


# ---- --show: the message a case's alert would send ---------------------------------------------------------


def test_show_prints_the_rendered_message_of_each_alert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    assert main(["rules", "test", str(d), "--show"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = out.index(f"PASS  {d}/site.cpu-hot.test.yaml: node-02 is saturated")
    assert out[i + 1] == "      > site.cpu-hot (then resolved):"
    message = out[i + 2:out.index(f"PASS  {d}/site.cpu-hot.test.yaml: a quiet node raises nothing")]
    assert message[0] == "        [FIRING · warning] train waits on node-02: CPU saturated"
    assert "        Where the waiting begins: node-02 is 99.0% busy" in message
    assert "        Next step: look at node-02's top processes" in message
    # the evidence lines, as the console notifier prints them
    assert "          host.cpu_busy_pct  (max > 95)" in message and "            node-02  99 %" in message
    assert message[-1] == "        Rule: site.cpu-hot"
    assert all(line == "" or line.startswith("        ") for line in message)
    j = out.index(f"PASS  {d}/site.cpu-hot.test.yaml: a quiet node raises nothing")
    assert out[j + 1] == "      (no alert)"


def test_without_show_no_message_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "test", str(site(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "Where the waiting begins" not in out and "(no alert)" not in out and "2 passed, 0 failed" in out


def test_show_prints_the_message_of_a_failed_case_after_its_failures(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path, culprit="node-01")
    assert main(["rules", "test", str(d), "--show"]) == 1
    out = capsys.readouterr().out.splitlines()
    i = out.index(f"FAIL  {d}/site.cpu-hot.test.yaml: node-02 is saturated")
    assert "expected status=firing rule=site.cpu-hot culprit=node-01" in out[i + 1]
    assert "      > site.cpu-hot (then resolved):" in out[i + 1:]
    assert "        [FIRING · warning] train waits on node-02: CPU saturated" in out


# ---- exit status: one meaning per code, for both -----------------------------------------------------------


BROKEN = {
    "a template that does not parse": (RULE.replace('title: "{{ job }} waits', 'title: "{{ job } waits'),
                                       "site.cpu-hot.yaml:3: rule 'site.cpu-hot': 'title' template does not parse: "),
    "an unknown metric": (RULE.replace("metric: host.cpu_busy_pct", "metric: host.cpu_bsy_pct"),
                          "site.cpu-hot.yaml:7: rule 'site.cpu-hot': 'when.metric' must be a known metric"),
    "an unknown evidence key": (RULE.replace("ev['host.cpu_busy_pct']", "ev['host.cpu_busy']"),
                                "site.cpu-hot.yaml:4: rule 'site.cpu-hot': 'cause' template reads ev['host.cpu_busy'], "
                                "which is not a metric; did you mean 'host.cpu_busy_pct'?"),
    "not YAML": (RULE + "labels: [\n", "site.cpu-hot.yaml:9: not valid YAML"),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_check_and_test_exit_alike_on_the_same_broken_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          what: str) -> None:
    """`rules check` exited 1 and `rules test` 2 on the same file: both now say the rules are wrong (1)."""
    rule, says = BROKEN[what]
    d = site(tmp_path, rule=rule)
    assert main(["rules", "check", str(d)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{d}/{says}") and len(out.splitlines()) == 1
    assert main(["rules", "test", str(d)]) == 1
    got = capsys.readouterr()
    assert got.err.startswith(f"whywait rules: {d}/{says}") and len(got.err.splitlines()) == 1
    assert "PASS" not in got.out and "Traceback" not in got.err


def test_a_broken_test_file_is_exit_1_for_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    f = d / "site.cpu-hot.test.yaml"
    f.write_text(f.read_text().replace("kind: host", "kind: hots"))
    assert main(["rules", "check", str(d)]) == 1
    assert main(["rules", "test", str(d)]) == 1
    err = capsys.readouterr().err
    assert "whywait rules: 2 problems:\n" in err and f"\n  {f}:8: cases[0].events[1]" in err
    assert "unknown kind 'hots'" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, says", [
    (["rules", "check", "@/nope"], "whywait rules: @/nope: no such file or folder\n"),
    (["rules", "test", "@/nope"], "whywait rules: @/nope: no such file or folder\n"),
    (["rules", "check", "@/notes.md"],
     "whywait rules: @/notes.md: is not a rule file (rule files are YAML, named *.yaml or *.yml)\n"),
    (["rules", "test", "@/site-rules/site.cpu-hot.yaml"],
     "whywait rules: @/site-rules/site.cpu-hot.yaml: is not a rule-test file: rules test takes test files (named "
     "*.test.yaml or *.test.yml) or folders of rules and their tests; its tests are "
     "@/site-rules/site.cpu-hot.test.yaml\n"),
    (["rules", "test", "@/notes.md"],
     "whywait rules: @/notes.md: is not a rule-test file: rules test takes test files (named *.test.yaml or "
     "*.test.yml) or folders of rules and their tests\n"),
    (["rules", "test", "@/site-rules", "--rules", "@/notes.md"],
     "whywait rules: @/notes.md: is not a rule file (rule files are YAML, named *.yaml or *.yml)\n"),
    (["rules", "test", "@/site-rules", "--junit", "@/nowhere/junit.xml"],
     "whywait rules: --junit @/nowhere/junit.xml: its folder @/nowhere does not exist\n"),
    (["rules", "test", "@/site-rules", "--junit", "@"], "whywait rules: --junit @: is a folder; name a file\n"),
    (["rules", "check", ""], "whywait rules check: argument paths: an empty path (an unset variable?); "
                             "`whywait rules check --help` lists the options\n"),
    (["rules", "test", "--rules", ""], "whywait rules test: argument --rules: an empty path (an unset variable?); "
                                       "`whywait rules test --help` lists the options\n"),
    (["rules", "test", "--shwo"], "whywait rules test: unrecognized arguments: --shwo (did you mean --show?); "
                                  "`whywait rules test --help` lists the options\n"),
    (["rules", "chek"], "whywait rules: argument ACTION: invalid choice: 'chek' (did you mean 'check'?); "
                        "`whywait rules --help` lists the options\n"),
])
def test_a_wrong_command_line_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str], says: str) -> None:
    site(tmp_path)
    (tmp_path / "notes.md").write_text("# notes\n")
    argv = [a.replace("@", str(tmp_path)) for a in argv]
    assert exit_status(argv) == 2
    got = capsys.readouterr()
    assert got.err == says.replace("@", str(tmp_path)) and got.out == ""  # refused before any case ran


def exit_status(argv: list[str]) -> int:
    """``main``'s status, or argparse's (it exits for a wrong flag before a command runs)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("action", ["check", "test"])
def test_help_documents_the_exit_status(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rules", action, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 every rule and test file loads" in out
    assert "1 the rules or their tests are wrong: a file that does not load" in out
    assert "2 usage: an unknown flag, a path that does not exist or is not a rule or test file" in out


# ---- hostile layouts ---------------------------------------------------------------------------------------


def test_a_folder_with_other_files_checks_and_tests_its_rules_only(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    (d / "README.md").write_text("# our rules\n")
    (d / "blob.bin").write_bytes(b"\x00\xff\xfe")
    assert main(["rules", "check", str(d)]) == 0
    assert main(["rules", "test", str(d)]) == 0


def test_a_folder_named_like_a_rule_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    (d / "site.other.yaml").mkdir()
    assert main(["rules", "check", str(d)]) == 1
    assert capsys.readouterr().out == f"{d}/site.other.yaml: cannot read: Is a directory\n"
    assert main(["rules", "test", str(d)]) == 1
    assert capsys.readouterr().err == f"whywait rules: {d}/site.other.yaml: cannot read: Is a directory\n"


def test_duplicate_ids_across_files_name_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = site(tmp_path, name="a"), site(tmp_path, name="b")
    want = f"{b}/site.cpu-hot.yaml:2: rule 'site.cpu-hot': 'id' duplicates the rule in {a}/site.cpu-hot.yaml"
    assert main(["rules", "check", str(a), str(b)]) == 1
    assert capsys.readouterr().out == want + "\n"
    assert main(["rules", "test", str(a), str(b)]) == 1
    assert capsys.readouterr().err == f"whywait rules: {want}\n"


def test_a_path_given_twice_is_checked_and_tested_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    assert main(["rules", "check", str(d), str(d)]) == 0
    assert capsys.readouterr().err == "1 rule(s) and 1 test file(s) OK\n"
    assert main(["rules", "test", str(d), str(d / "site.cpu-hot.test.yaml")]) == 0
    assert capsys.readouterr().out.endswith("2 passed, 0 failed\n")


# ---- a new user's pass (session 22): a folder inside the shipped tree, and results as they come ------------------


def test_check_of_a_folder_inside_the_rules_tree_loads_the_rest_of_it(capsys: pytest.CaptureFixture[str]) -> None:
    # `rules check rules/network` reported 8 errors (macros and inhibited rules it could not find) where
    # `rules test rules/network` loaded the rest of rules/ and passed.
    repo = Path(__file__).resolve().parents[2]
    assert main(["rules", "check", str(repo / "rules" / "network")]) == 0
    err = capsys.readouterr().err
    assert "lies in the rules tree" in err and "3 rule(s) and 3 test file(s) OK" in err, err
    assert main(["rules", "check", str(repo / "rules" / "network" / "network.link-flap.yaml")]) == 0
    assert "1 rule(s) and 0 test file(s) OK" in capsys.readouterr().err


def test_each_case_is_reported_as_it_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Piped, `rules test rules` printed nothing for 11 minutes: every line came at the end.
    from whywait.engine.commands import rules_cmd

    seen: list[str] = []
    real = rules_cmd._print_result

    def spy(r: object, show: bool) -> None:
        got = capsys.readouterr()
        seen.append(got.err + got.out)  # what was printed before this case's line: the earlier cases'
        real(r, show)  # type: ignore[arg-type]

    monkeypatch.setattr(rules_cmd, "_print_result", spy)
    d = site(tmp_path)
    assert main(["rules", "test", str(d)]) == 0
    assert "rules test: running 2 case(s) from 1 test file(s)" in seen[0]
    assert len(seen) == 2 and "PASS" in seen[1] and "node-02 is saturated" in seen[1]  # printed before case 2 ran


def test_a_misspelt_metric_names_the_one_meant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path, rule=RULE.replace("metric: host.cpu_busy_pct", "metric: host.cpu_busy_pc"))
    assert main(["rules", "check", str(d)]) == 1
    out = capsys.readouterr().out
    assert "site.cpu-hot.yaml:7: rule 'site.cpu-hot': 'when.metric' must be a known metric" in out, out
    assert "did you mean host.cpu_busy_pct?" in out and "(got 'host.cpu_busy_pc')" in out
    d2 = site(tmp_path, rule=RULE.replace("metric: host.cpu_busy_pct", "metric: zzz"), name="other")
    assert main(["rules", "check", str(d2)]) == 1
    assert "did you mean" not in capsys.readouterr().out  # nothing like it: no guess


def test_a_case_can_assert_on_the_whole_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # text_contains reads the title, cause and next step only; an evidence line (what --show prints) needs this
    d = site(tmp_path)
    test = d / "site.cpu-hot.test.yaml"
    test.write_text(test.read_text().replace("detected: [1s, 3s]}",
                                             "detected: [1s, 3s], message_contains: ['host.cpu_busy_pct']}"))
    assert main(["rules", "test", str(d)]) == 0, capsys.readouterr()
    test.write_text(test.read_text().replace("message_contains: ['host.cpu_busy_pct']",
                                             "message_contains: ['no such line']"))
    assert main(["rules", "test", str(d)]) == 1
    assert "FAIL" in capsys.readouterr().out
    test.write_text(test.read_text().replace("message_contains: ['no such line']", "message_contains: 5"))
    assert main(["rules", "check", str(d)]) == 1
    out = capsys.readouterr().out
    assert "cases[0].expect[0].message_contains: must be a string or a list of strings (got 5)" in out
