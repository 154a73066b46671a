"""A template naming a filter or test Jinja does not have is a rule error at its line, never a crash.

Jinja only finds such a name when it compiles the template (or, inside an ``{% if %}``, when it runs), so
``rules check``, ``rules test``, engine start, replay and hot reload all met a ``TemplateAssertionError``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from whywait.engine.rules.loader import RuleLoadError, load_rules
from whywait.engine.rules.reload import RuleReloader

from tests.rules.test_schema import GOOD


def errors(tmp_path: Path, rule: str) -> list[str]:
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(rule)
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    return [str(e).replace(str(f), "F") for e in exc.value.errors]


@pytest.mark.parametrize("title, want", [
    ("{{ job | nosuchfilter }}", "template: no filter named 'nosuchfilter'"),
    ("{{ job | numm(1) }}", "template: no filter named 'numm'; did you mean 'num'?"),
    ("{% if job %}{{ job | nosuchfilter }}{% endif %}", "template: no filter named 'nosuchfilter'"),
    ("{{ job is nosuchtest }}", "template: no test named 'nosuchtest'"),
    ("{% if job is nosuchtest %}x{% endif %}", "template: no test named 'nosuchtest'"),
    ("{% include 'other' %}", "template: {% include %} is not available in rule text"),
])
def test_an_unknown_filter_or_test_is_a_rule_error_at_its_line(tmp_path: Path, title: str, want: str) -> None:
    (line,) = errors(tmp_path, GOOD.replace('title: "{{ job }} slow"', f'title: "{title}"'))
    assert line.startswith(f"F:3: rule 'network.test-rule': 'title' {want}")


def test_the_line_is_the_filter_s_own_in_a_folded_block(tmp_path: Path) -> None:
    rule = GOOD.replace('cause: "because"', "cause: >-\n  {{ job }} waits\n  on {{ node | nosuchfilter }}\n")
    assert errors(tmp_path, rule) == ["F:6: rule 'network.test-rule': 'cause' template: no filter named "
                                      "'nosuchfilter'"]


def test_reload_refuses_an_unknown_filter_and_keeps_the_last_good_rules(tmp_path: Path) -> None:
    d = tmp_path / "rules"
    d.mkdir()
    f = d / "network.test-rule.yaml"
    f.write_text(GOOD)
    r = RuleReloader([d])
    f.write_text(GOOD.replace('title: "{{ job }} slow"', 'title: "{{ job | nosuchfilter }}"'))
    st = f.stat()
    os.utime(f, (st.st_atime, st.st_mtime + 5))
    res = r.poll()
    assert res is not None and not res.ok
    assert res.errors == (f"{f}:3: rule 'network.test-rule': 'title' template: no filter named 'nosuchfilter'",)


def test_reload_keeps_the_last_good_rules_whatever_loading_raises(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from whywait.engine.rules import reload

    d = tmp_path / "rules"
    d.mkdir()
    f = d / "network.test-rule.yaml"
    f.write_text(GOOD)
    r = RuleReloader([d])

    def broken(paths: object) -> None:
        raise ValueError("a bug in the loader")

    monkeypatch.setattr(reload, "load_rules", broken)
    f.write_text(GOOD + "# edited\n")
    res = r.poll()
    assert res is not None and not res.ok
    assert res.errors == ("the rules could not be loaded: ValueError: a bug in the loader",)
