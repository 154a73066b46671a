"""Rule templates are checked at load: Jinja errors and evidence typos at their real line in the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.rules.loader import RuleLoadError, load_rules

HEAD = """\
apiVersion: whywait/v1
id: network.test-rule
title: "{{ job }} slow"
next_step: "look"
when: {type: threshold, metric: net.tcp_retrans_segs_per_s, value: "> 10", culprit: true}
"""


def errors(tmp_path: Path, body: str) -> list[str]:
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(HEAD + body)
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    return [str(e).replace(str(f), "F") for e in exc.value.errors]


def test_syntax_error_in_a_literal_block_is_on_its_line(tmp_path: Path) -> None:
    body = "cause: |\n  {{ node }} is slow\n  and {% if ev %}unclosed\n"
    (line,) = errors(tmp_path, body)  # line 6 is `cause: |`; the unclosed `if` stands on line 8
    assert line.startswith("F:8: rule 'network.test-rule': 'cause' template does not parse: Unexpected end of "
                           "template.") and "The innermost block that needs to be closed is 'if'." in line


def test_syntax_error_in_a_folded_block_is_on_its_line_though_yaml_joined_the_lines(tmp_path: Path) -> None:
    body = "cause: >-\n  {{ node }} is slow\n  because\n  of {{ ev['job.comm_s'].value | }}\n"
    (line,) = errors(tmp_path, body)
    assert line.startswith("F:9: rule 'network.test-rule': 'cause' template does not parse: ")


def test_a_misspelt_evidence_key_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    body = ("cause: >-\n  {{ node }} waits\n  {{ ev['storage.read_latncy_ms'].value }} ms\n"
            "  ({{ ev['job.comm_s'].valeu }})\n")
    assert errors(tmp_path, body) == [
        "F:8: rule 'network.test-rule': 'cause' template reads ev['storage.read_latncy_ms'], which is not a metric; "
        "did you mean 'storage.read_latency_ms'?",
        "F:9: rule 'network.test-rule': 'cause' template reads ev['job.comm_s'].valeu, which evidence does not have "
        "(fields: baseline, entity, metric, note, threshold, unit, value, window_s)"]


def test_an_unknown_template_variable_names_its_key_line(tmp_path: Path) -> None:
    (line,) = errors(tmp_path, 'cause: "ok"\nlabels: {owner: "{{ tema }}"}\n')
    assert line.startswith("F:7: rule 'network.test-rule': 'labels.owner' template uses unknown variable(s) tema")


def test_evidence_the_evaluator_adds_beside_metrics_is_accepted(tmp_path: Path) -> None:
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(HEAD + "cause: \"{{ ev['topology'].note }} {{ ev['check'].entity }}\"\n")
    assert list(load_rules([f]).rules) == ["network.test-rule"]


def test_an_override_s_template_error_names_the_override_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "network.test-rule.yaml").write_text(HEAD + 'cause: "fine"\n')
    site = tmp_path / "b" / "site.yaml"
    site.write_text("override: network.test-rule\n# a comment\ncause: |\n  first\n  {{ ev['net.nope'] }}\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([tmp_path / "a", tmp_path / "b"])
    assert [str(e) for e in exc.value.errors] == [
        f"{site}:5: rule 'network.test-rule': 'cause' template reads ev['net.nope'], which is not a metric "
        "(see `whywait rules metrics`)"]


def test_a_duplicate_key_in_a_rule_names_both_lines(tmp_path: Path) -> None:
    (line,) = errors(tmp_path, 'cause: "a"\ntitle: "again"\n')
    assert line == "F:7: duplicate key 'title' (the first is on line 3)"
