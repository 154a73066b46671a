"""The rule schema: malformed rules are refused with file, line, rule id, key path, expected vs got."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.rules.loader import RuleLoadError, load_rules
from whywait.engine.rules.schema import AllOf, Condition

GOOD = """\
apiVersion: whywait/v1
id: network.test-rule
title: "{{ job }} slow"
cause: "because"
next_step: "look"
when:
  all:
    - type: peer_outlier
      metric: net.tcp_retrans_segs_per_s
      window: 5s
      ratio: "> 10"
      culprit: true
    - type: self_history
      metric: job.comm_s
      ratio: "> 1.3"
"""

# Each malformed rule is paired with the exact error lines it must produce.
CASES = [
    ("window-not-duration", GOOD.replace("window: 5s", "window: 5"),
     ["{f}:10: rule 'network.test-rule': 'when.all[0].window' must be a duration like '60s' "
      "(units ms, s, m, h, d, w) (got 5)"]),
    ("unknown-key", GOOD.replace("ratio: \"> 10\"", "ratio: \"> 10\"\n      threshold: 3"),
     ["{f}:12: rule 'network.test-rule': 'when.all[0].threshold' is not a parameter of 'peer_outlier' "
      "(valid: agg, culprit, direction, metric, min_peers, min_value, name, peers, ratio, scope, steps, type, window, "
      "zscore)"]),
    ("unknown-metric-and-bad-compare", GOOD.replace("job.comm_s", "job.comms").replace('"> 1.3"', "1.3"),
     ["{f}:14: rule 'network.test-rule': 'when.all[1].metric' must be a known metric "
      "(see `whywait rules metrics`; did you mean job.comm_s?) (got 'job.comms')",
      "{f}:15: rule 'network.test-rule': 'when.all[1].ratio' must be a comparison like '> 10' (got 1.3)"]),
    ("unknown-type", GOOD.replace("type: self_history", "type: selfhistory"),
     ["{f}:13: rule 'network.test-rule': 'when.all[1].type' must be one of all, any, not, macro, or a condition "
      "type (threshold, peer_outlier, self_history, trend, change_point, absence, event, topology, step_outlier, "
      "phase, stage_imbalance, clock_offset, rotation, periodic, what_if) "
      "(got 'selfhistory')"]),
    ("missing-keys", "apiVersion: whywait/v1\nid: network.test-rule\nwhen: {type: absence, level: rank}\n",
     ["{f}:1: rule 'network.test-rule': 'title' is required (a Jinja2 template string)",
      "{f}:1: rule 'network.test-rule': 'cause' is required (a Jinja2 template string)",
      "{f}:1: rule 'network.test-rule': 'next_step' is required (a Jinja2 template string)",
      "{f}:3: rule 'network.test-rule': 'when.for' is required for 'absence'"]),
    ("bad-severity-and-id", GOOD.replace("id: network.test-rule", "id: network.test-rule\nseverity: loud"),
     ["{f}:3: rule 'network.test-rule': 'severity' must be one of info, warning, critical (got 'loud')"]),
    ("every-under-a-tick", GOOD.replace('next_step: "look"', 'next_step: "look"\nevery: 500ms'),
     ["{f}:6: rule 'network.test-rule': 'every' must be a duration of whole seconds from 1s to 60s (got '500ms')"]),
    ("every-not-whole-seconds", GOOD.replace('next_step: "look"', 'next_step: "look"\nevery: 2500ms'),
     ["{f}:6: rule 'network.test-rule': 'every' must be a duration of whole seconds from 1s to 60s (got '2500ms')"]),
    ("every-too-long", GOOD.replace('next_step: "look"', 'next_step: "look"\nevery: 5m'),
     ["{f}:6: rule 'network.test-rule': 'every' must be a duration of whole seconds from 1s to 60s (got '5m')"]),
    ("every-bare-number", GOOD.replace('next_step: "look"', 'next_step: "look"\nevery: 5'),
     ["{f}:6: rule 'network.test-rule': 'every' must be a duration like '60s' (units ms, s, m, h, d, w) (got 5)"]),
    ("bad-yaml", "apiVersion: whywait/v1\nid: [unclosed\n",
     ["{f}:3: not valid YAML: expected ',' or ']', but got '<stream end>'"]),
    ("bad-template", GOOD.replace('cause: "because"', 'cause: "{{ job "'),
     ["{f}:4: rule 'network.test-rule': 'cause' template does not parse: unexpected end of template, "
      "expected 'end of print statement'."]),
]


@pytest.mark.parametrize("name,text,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_rule_messages(tmp_path: Path, name: str, text: str, expected: list[str]) -> None:
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(text)
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    assert [str(e) for e in exc.value.errors] == [e.format(f=f) for e in expected]


def test_good_rule_loads_typed_and_frozen(tmp_path: Path) -> None:
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(GOOD)
    rs = load_rules([tmp_path])
    rule = rs.rules["network.test-rule"]
    assert isinstance(rule.when, AllOf)
    leaf = rule.when.items[0]
    assert isinstance(leaf, Condition)
    assert leaf.params["window"] == 5.0 and leaf.culprit is True
    assert str(leaf.params["ratio"]) == "> 10"
    with pytest.raises(AttributeError):
        rule.id = "x"  # type: ignore[misc]


def test_id_must_match_file_name_and_duplicates_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "network.other.yaml").write_text(GOOD)
    with pytest.raises(RuleLoadError) as exc:
        load_rules([tmp_path])
    assert "must match the file name 'network.other'" in str(exc.value)


def test_inhibits_must_name_a_rule(tmp_path: Path) -> None:
    (tmp_path / "network.test-rule.yaml").write_text(GOOD + "inhibits: [storage.nope]\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([tmp_path])
    assert str(exc.value).endswith(
        ":16: rule 'network.test-rule': 'inhibits[0]' must name a loaded rule (got 'storage.nope'); load the folder "
        "that holds it too, e.g. --rules rules")


def test_shipped_rules_load() -> None:
    rs = load_rules([Path(__file__).resolve().parents[2] / "rules"])
    assert "network.straggler-retransmits" in rs.rules


def test_site_override_changes_a_shipped_rule_without_copying(tmp_path: Path) -> None:
    shipped, site = tmp_path / "shipped", tmp_path / "site"
    shipped.mkdir()
    site.mkdir()
    (shipped / "network.test-rule.yaml").write_text(GOOD + "labels: {team: net}\n")
    (site / "stricter.yaml").write_text("override: network.test-rule\nseverity: critical\nfor: 30s\n"
                                        "labels: {site: dc1}\n")
    rule = load_rules([shipped, site]).rules["network.test-rule"]
    assert rule.severity == "critical" and rule.for_s == 30.0
    assert rule.labels == {"team": "net", "site": "dc1"}
    assert rule.when.items[0].params["window"] == 5.0  # type: ignore[union-attr]  # untouched


def test_override_errors_name_the_override_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "network.test-rule.yaml").write_text(GOOD)
    (tmp_path / "b").mkdir()
    site = tmp_path / "b" / "site.yaml"
    site.write_text("override: network.test-rule\nfor: soon\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([tmp_path / "a", tmp_path / "b"])
    assert [str(e) for e in exc.value.errors] == [
        f"{site}:2: rule 'network.test-rule': 'for' must be a duration like '60s' (units ms, s, m, h, d, w) "
        "(got 'soon')"]


def test_disable_and_extends(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "network.test-rule.yaml").write_text(GOOD)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "network.test-rule-copy.yaml").write_text(
        "extends: network.test-rule\nid: network.test-rule-copy\nseverity: info\n")
    (tmp_path / "b" / "off.yaml").write_text("override: network.test-rule\ndisable: true\n")
    rs = load_rules([tmp_path / "a", tmp_path / "b"])
    assert list(rs.rules) == ["network.test-rule-copy"]
    assert rs.rules["network.test-rule-copy"].severity == "info"


def test_override_of_unknown_rule(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("override: network.nope\nseverity: info\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    assert str(exc.value) == (f"{f}:1: 'override' must name a rule loaded before it (got 'network.nope'); load the "
                              "rules that hold it first, before this folder (--rules FOLDER)")


def test_template_with_an_unknown_variable_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(GOOD.replace('next_step: "look"', 'next_step: "look at {{ nod }}"'))
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    msg = str(exc.value)
    assert msg.startswith(f"{f}:5: rule 'network.test-rule': 'next_step' template uses unknown variable(s) nod "
                          "(known: actual_nic, aligned_steps, burst_s, bursts, changed_at, channel,")


def test_evidence_conditions_parse_and_must_be_conditions(tmp_path: Path) -> None:
    f = tmp_path / "network.test-rule.yaml"
    f.write_text(GOOD + "evidence:\n  - {type: threshold, metric: net.rx_drops_per_s, value: '> 0', scope: culprit}\n")
    rule = load_rules([f]).rules["network.test-rule"]
    assert len(rule.evidence) == 1 and rule.evidence[0].on == "culprit"  # type: ignore[union-attr]
    f.write_text(GOOD + "evidence: [drops]\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([f])
    assert "'evidence[0]' must be a condition mapping (got 'drops')" in str(exc.value)


def test_a_refused_rule_is_named_once_not_again_by_every_rule_that_inhibits_it(tmp_path: Path) -> None:
    broken = GOOD.replace("network.test-rule", "storage.broken").replace("window: 5s", "window: 5")
    (tmp_path / "storage.broken.yaml").write_text(broken)
    (tmp_path / "storage.unparsable.yaml").write_text("id: [storage.unparsable\n")
    (tmp_path / "network.test-rule.yaml").write_text(
        GOOD + "inhibits: [storage.broken, storage.unparsable]\nsupersedes: [storage.broken]\n")
    with pytest.raises(RuleLoadError) as exc:
        load_rules([tmp_path])
    lines = str(exc.value).splitlines()
    assert any("storage.broken.yaml:10:" in x and "'when.all[0].window' must be a duration" in x for x in lines)
    assert any("storage.unparsable.yaml" in x for x in lines)
    assert not any("network.test-rule.yaml" in x for x in lines), lines
