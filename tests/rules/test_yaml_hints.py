"""A rule or rule-test file that is not valid YAML gets plain words after PyYAML's: bad indentation gave only
``expected <block end>, but found '<block mapping start>'`` (the line was right, the words said nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.rules.loader import RuleLoadError, load_rules
from whywait.simulate.ruletest import RuleTestError, load_cases

INDENT = ("check the indentation here and on the line above: a mapping's keys start in one column, a list's "
          "items ('- ') under their key, with spaces")
QUOTE = "a value starting with '{', '[' or a quote is read as YAML, not text: quote the whole value"
HEAD = "apiVersion: whywait/v1\nid: site.x\n"

CASES = [
    ("a key off its mapping's column", HEAD + "when:\n  all:\n    - type: threshold\n   metric: host.cpu_busy_pct\n",
     6, "expected <block end>, but found '<block mapping start>'", INDENT),
    ("a key indented under a value", HEAD + "title: x\n  cause: y\n", 4, "mapping values are not allowed here",
     INDENT),
    ("a tab", HEAD + "when:\n\tall: []\n", 4, "found character '\\t' that cannot start any token",
     "a tab: YAML indents with spaces only"),
    ("an unquoted colon", HEAD + "title: slow: really\n", 3, "mapping values are not allowed here",
     "a value holding ': ' must be quoted"),
    ("a template not quoted", HEAD + "title: {{ job }} is slow\n", 3, "expected <block end>, but found '<scalar>'",
     QUOTE),
    ("a quote that does not end the value", HEAD + 'cause: "{{ job }}" is slow\n', 3,
     "expected <block end>, but found '<scalar>'", QUOTE),
]


@pytest.mark.parametrize("name,text,line,pyyaml,hint", CASES, ids=[c[0] for c in CASES])
def test_a_yaml_slip_in_a_rule_is_said_in_plain_words(tmp_path: Path, name: str, text: str, line: int,
                                                      pyyaml: str, hint: str) -> None:
    f = tmp_path / "site.x.yaml"
    f.write_text(text)
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    (e,) = exc.value.errors
    assert str(e).startswith(f"{f}:{line}: not valid YAML: {pyyaml}; {hint}"), str(e)


def test_a_template_alone_not_quoted_gets_the_hint_too(tmp_path: Path) -> None:
    f = tmp_path / "site.x.yaml"
    f.write_text(HEAD + "title: {{ job }}\n")
    with pytest.raises(RuleLoadError, match=r":3: a non-scalar key is not supported here: keys are names; a value "
                                            r"starting with '\{'"):
        load_rules([f])


def test_a_yaml_slip_in_a_rule_test_gets_the_hint(tmp_path: Path) -> None:
    f = tmp_path / "site.x.test.yaml"
    f.write_text("rule: site.x\ncases:\n  - name: a\n    expect: []\n   events: []\n")
    with pytest.raises(RuleTestError) as exc:
        load_cases(f)
    assert str(exc.value).endswith(f"; {INDENT}") and f"{f}:5: not valid YAML" in str(exc.value)


def test_other_yaml_errors_are_as_they_were(tmp_path: Path) -> None:
    f = tmp_path / "site.x.yaml"
    f.write_text(HEAD + "id: [unclosed\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    assert str(exc.value) == f"{f}:4: not valid YAML: expected ',' or ']', but got '<stream end>'"
