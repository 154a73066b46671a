"""A template that fails while rendering gives its own text with a note, counted and reported: never an exception.

The evaluator renders every text of a diagnosis; an exception there (a zero baseline, ``1/0``, a loop that would
not end) stopped every diagnosis.  Rendering is also bounded, so a runaway template costs milliseconds.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from whywait.engine.rules import templating
from whywait.engine.rules.loader import load_rules
from whywait.engine.rules.templating import RENDER_ERRORS, capture_render_errors, render

from tests.rules.test_schema import GOOD

RUNAWAY = [
    "{{ 1/0 }}",
    "{% for i in range(10**9) %}x{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for c in range(30000)|join %}{% for d in range(30000)|join %}{% endfor %}{% endfor %}",
    "{{ 'x' * 10**9 }}",
    "{{ 10**100000 }}",
    "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
    "{{ 'x' | center(10**9) }}",
    "{{ 'x'.ljust(10**9) }}",
    "{{ '%999999999s' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}",
    "{% set ns = namespace(x='a') %}{% for i in range(60) %}{% set ns.x %}{{ ns.x }}{{ ns.x }}{% endset %}"
    "{% endfor %}{{ ns.x }}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}x{% endmacro %}{{ f(60) }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{% if job %}{{ job | nosuchfilter }}{% endif %}",
]


@pytest.mark.parametrize("template", RUNAWAY)
def test_a_failing_or_runaway_template_gives_its_text_with_a_note(template: str) -> None:
    t0 = time.perf_counter()
    with capture_render_errors() as failed:
        out = render(template, {"job": "j"}, "network.runaway", "title")
    assert time.perf_counter() - t0 < 2.0
    assert out.startswith(template) and out.endswith(" in title]") and "[template error: " in out
    (err,) = failed
    assert str(err).startswith("rule 'network.runaway': 'title' template failed to render: ")


def test_a_zero_baseline_names_the_rule_file_and_line_counted_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    title = ("{{ node }} drops {{ (ev['net.rx_drops_per_s'].value / ev['net.rx_drops_per_s'].baseline) | num(1) }}"
             "x the job median")
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(GOOD.replace('title: "{{ job }} slow"', f'title: "{title}"'))
    rule = load_rules([f]).rules["network.test-rule"]

    class Ev:
        value, baseline = 12.0, 0.0

    RENDER_ERRORS.clear()  # logged once per rule and field in a process: start this one afresh
    with caplog.at_level(logging.WARNING, logger=templating.__name__), capture_render_errors() as failed:
        outs = [render(rule.title, {"node": "node-03", "ev": {"net.rx_drops_per_s": Ev()}}) for _ in range(3)]
    assert outs == [f"{title} [template error: ZeroDivisionError in title]"] * 3
    assert [str(e) for e in failed] == [f"{f}:3: rule 'network.test-rule': 'title' template failed to render: "
                                        "ZeroDivisionError: float division by zero"]
    assert RENDER_ERRORS.total == 3 and RENDER_ERRORS.counts == {("network.test-rule", "title"): 3}
    assert len([r for r in caplog.records if "failed to render" in r.getMessage()]) == 1


def test_a_long_text_is_cut_with_a_note() -> None:
    with capture_render_errors() as failed:
        out = render("{% for i in range(5000) %}{{ i }},{% endfor %}", {})
    assert len(out) < templating.MAX_OUTPUT_CHARS + 100 and out.endswith("characters]")
    assert "the text is over 20,000 characters" in str(failed[0])


@pytest.mark.parametrize("template, want", [
    ("{{ job }} on {{ node }}", "j on node-01"),
    ("{% for r in [1, 2, 3] %}{{ r }}{% if not loop.last %}, {% endif %}{% endfor %}", "1, 2, 3"),
    ("{{ range(3) | join('-') }} {{ 5000000000 | num(0) }} {{ '%d' | format(5000000000) }}",
     "0-1-2 5,000,000,000 5000000000"),
    ("{{ '{:,}'.format(5000000000) }} {{ 2 ** 64 }} {{ 'ab' * 3 }}", "5,000,000,000 18446744073709551616 ababab"),
    ("{% macro f(n) %}{{ n }}{% endmacro %}{{ f(4) }}{{ job ~ '!' }}", "4j!"),
])
def test_ordinary_templates_render_as_before(template: str, want: str) -> None:
    with capture_render_errors() as failed:
        assert render(template, {"job": "j", "node": "node-01"}) == want
    assert failed == []
