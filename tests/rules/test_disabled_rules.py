"""A site disabling a shipped rule as docs/rules.md "Site overrides" shows (``override: <id>`` + ``disable: true``).

``rules check rules site`` refused it with 30 errors, one per shipped rule whose ``inhibits:`` named the disabled
rule, and the shipped test file of that rule broke the check; a ``disable:`` that was not a boolean (``"true"``,
``1``, ``[true]``, ``yes please``) was taken for false and said OK.  A site folder checked alone, as
site-rules/README.md said, failed with ``'override' must name a rule loaded before it`` and no hint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.cli import main
from whywait.engine.commands.rules_cmd import rules_path_arg
from whywait.engine.rules.loader import RuleLoadError, load_rules, shipped_rules_dir
from whywait.engine.rules.reload import RuleReloader
from whywait.simulate.ruletest import load_files

RULES = Path(__file__).resolve().parents[2] / "rules"
OFF = "override: job.whole-job-slow\ndisable: true\n"


def site(tmp_path: Path, text: str = OFF, name: str = "off.yaml") -> Path:
    d = tmp_path / "site"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    return d


def test_a_rule_others_inhibit_can_be_disabled(tmp_path: Path) -> None:
    d = site(tmp_path)
    rs = load_rules([RULES, d])
    assert "job.whole-job-slow" not in rs.rules
    assert rs.disabled == {"job.whole-job-slow": str(d / "off.yaml")}
    # the rules that inhibit it are loaded as they are: the reference has nothing to mute
    assert any("job.whole-job-slow" in r.inhibits for r in rs)


def test_a_rule_others_supersede_can_be_disabled(tmp_path: Path) -> None:
    superseded = next(t for r in load_rules([RULES]) for t in r.supersedes)
    rs = load_rules([RULES, site(tmp_path, f"override: {superseded}\ndisable: true\n")])
    assert superseded in rs.disabled and superseded not in rs.rules


def test_hot_reload_takes_a_disabled_rule(tmp_path: Path) -> None:
    d = site(tmp_path, "override: job.whole-job-slow\nseverity: info\n")
    reloader = RuleReloader([RULES, d])
    (d / "off.yaml").write_text(OFF + "# now off\n")
    res = reloader.poll()
    assert res is not None
    assert res.ok and res.errors == (), res.errors
    assert res.rules is not None and "job.whole-job-slow" not in res.rules.rules


def test_rules_check_skips_the_disabled_rule_s_own_tests_and_says_so(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    assert main(["rules", "check", str(RULES), str(d)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == (f"rules check: skipped 1 test file(s) of disabled rule(s): "
                        f"{RULES / 'job' / 'job.whole-job-slow.test.yaml'} (job.whole-job-slow, disabled by "
                        f"{d / 'off.yaml'})")
    assert lines[1].endswith("test file(s) OK") and len(lines) == 2


def test_a_case_naming_a_disabled_rule_is_accepted(tmp_path: Path) -> None:
    # another rule's case may expect the disabled one absent: it is known, not loaded
    d = site(tmp_path)
    (d / "x.test.yaml").write_text(
        "rule: job.stalled\ncases:\n- name: quiet\n  topology: {cluster: {nodes: 2}}\n  events: []\n"
        "  expect:\n  - {rule: job.whole-job-slow, absent: true}\n")
    assert [f.name for f, _ in load_files(load_rules([RULES, d]), [d])] == ["x.test.yaml"]


def test_rules_test_skips_the_disabled_rule_s_own_tests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    shipped = RULES / "job" / "job.whole-job-slow.test.yaml"
    assert main(["rules", "test", "--rules", "shipped", str(d), str(shipped)]) == 0
    out, err = capsys.readouterr()
    assert f"rules test: skipped 1 test file(s) of disabled rule(s): {shipped} (job.whole-job-slow" in err
    assert out.splitlines() == ["0 passed, 0 failed"]


@pytest.mark.parametrize("value", ['"true"', "1", "[true]", "yes please", "'false'", "~", "{on: true}"])
def test_disable_must_be_a_boolean(tmp_path: Path, value: str) -> None:
    d = site(tmp_path, f"# turn it off\noverride: job.whole-job-slow\ndisable: {value}\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([RULES, d])
    assert [str(e) for e in exc.value.errors] == [
        f"{d / 'off.yaml'}:3: 'disable' must be true or false, unquoted "
        f"(got {exc.value.errors[0].message.split('(got ', 1)[1]}"]
    assert "must be true or false, unquoted (got " in str(exc.value)


def test_disable_false_keeps_the_rule_and_applies_the_rest(tmp_path: Path) -> None:
    rs = load_rules([RULES, site(tmp_path, "override: job.whole-job-slow\ndisable: false\nseverity: info\n")])
    assert rs.rules["job.whole-job-slow"].severity == "info" and not rs.disabled


def test_disable_in_an_extends_is_refused(tmp_path: Path) -> None:
    d = site(tmp_path, "extends: job.whole-job-slow\nid: site.whole-job-slow\ndisable: true\n",
             name="site.whole-job-slow.yaml")
    with pytest.raises(RuleLoadError, match=r"site.whole-job-slow.yaml:3: 'disable' is for an override:"):
        load_rules([RULES, d])


def test_a_site_folder_checked_alone_is_told_to_load_the_shipped_rules_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = site(tmp_path)
    assert main(["rules", "check", str(d)]) == 1
    out = capsys.readouterr().out
    assert out == (f"{d / 'off.yaml'}:1: 'override' must name a rule loaded before it (got 'job.whole-job-slow'); "
                   f"'job.whole-job-slow' is a shipped rule: load the shipped rules first, before this folder "
                   f"(--rules shipped, that is {shipped_rules_dir()})\n")
    # as it says: `rules check --rules shipped site`, and the shipped folder itself named as a path
    assert main(["rules", "check", "--rules", "shipped", str(d)]) == 0
    assert main(["rules", "check", "shipped", str(d)]) == 0
    assert main(["rules", "check", "--rules", str(shipped_rules_dir()), str(d)]) == 0


def test_an_override_with_a_typo_gets_a_did_you_mean(tmp_path: Path) -> None:
    d = site(tmp_path, "override: job.whole-job-slw\nseverity: info\n")
    with pytest.raises(RuleLoadError, match=r"\(got 'job.whole-job-slw'\); did you mean 'job.whole-job-slow'\?$"):
        load_rules([RULES, d])


def test_shipped_names_the_shipped_rules_and_a_folder_so_named_is_dot_slash() -> None:
    assert rules_path_arg("shipped") == shipped_rules_dir() == RULES
    assert rules_path_arg("./shipped") == Path("shipped")
    assert (shipped_rules_dir() / "macros.yaml").is_file()
