"""The rule backtest compares firings (fire → resolve spans), not incident identities.

One job's storage pool slowed twice (same incident, same fingerprint): the old rules fired at both, the new
(a raised threshold) only at the second.  The backtest keyed incidents by fingerprint, kept one firing of each
and said `0 only in the new rules, 0 only in the old, ... 2 the same`: the lost detection was hidden.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.replay import ReplayResult, backtest, incidents, replay
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import parse_fault_spec
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

T0 = 1_796_472_762.0
FP = "site.pool-latency-dataload|job=train-llm"


def diag(status: str, at: float, starts: float | None = None, rule: str = "site.pool-latency-dataload",
         fp: str = FP, title: str = "train-llm: pool scratch reads above 15 ms") -> Diagnosis:
    return Diagnosis(rule_id=rule, fingerprint=fp, status=status, severity="critical",  # type: ignore[arg-type]
                     title=title, cause="slow pool", job="train-llm", owner=None,
                     starts_at=at - 3 if starts is None else starts, detected_at=at,
                     ends_at=at if status == "resolved" else None, culprit="scratch")


def firing(fire: float, resolve: float, **kw: object) -> list[Diagnosis]:
    return [diag("firing", fire, **kw), diag("resolved", resolve, starts=fire - 3, **kw)]  # type: ignore[arg-type]


def result(*firings: list[Diagnosis]) -> ReplayResult:
    ds = sorted((d for f in firings for d in f), key=lambda d: d.detected_at)
    return ReplayResult(ds, 1000, T0, T0 + 700)


def test_a_firing_lost_when_the_same_incident_fires_twice_is_only_in_the_old_rules() -> None:
    old = result(firing(T0 + 205, T0 + 300), firing(T0 + 464, T0 + 550))
    new = result(firing(T0 + 464, T0 + 550))
    cmp = backtest(new, old)
    assert cmp["same"] == 1 and not cmp["only_new"] and not cmp["timing"] and not cmp["changed"], cmp
    assert [(d["detected_at"], d["firing"], d["firings"]) for d in cmp["only_old"]] == [(T0 + 205, 1, 2)]
    # and the other way round: a firing only the new rules have
    cmp = backtest(old, new)
    assert [d["detected_at"] for d in cmp["only_new"]] == [T0 + 205] and cmp["same"] == 1 and not cmp["only_old"]


def test_firings_are_matched_to_the_nearest_in_time_and_report_how_much_earlier_or_later() -> None:
    old = result(firing(T0 + 205, T0 + 300), firing(T0 + 464, T0 + 550))
    new = result(firing(T0 + 215, T0 + 300), firing(T0 + 460, T0 + 550))
    cmp = backtest(new, old)
    got = [(d["detected_at"], d["seconds"], d["direction"]) for d in cmp["timing"]]
    assert got == [(T0 + 215, -10.0, "later"), (T0 + 460, 4.0, "earlier")], cmp
    assert not cmp["only_new"] and not cmp["only_old"] and cmp["same"] == 0


def test_firings_far_apart_that_do_not_overlap_are_not_the_same_firing() -> None:
    old = result(firing(T0 + 100, T0 + 150))
    new = result(firing(T0 + 500, T0 + 550))
    cmp = backtest(new, old)
    assert len(cmp["only_new"]) == 1 and len(cmp["only_old"]) == 1 and not cmp["timing"], cmp
    # within the tolerance they are one firing, later
    cmp = backtest(new, old, match_within_s=600)
    assert [d["seconds"] for d in cmp["timing"]] == [-400.0] and not cmp["only_new"] and not cmp["only_old"]


def test_a_firing_detected_later_within_a_long_overlapping_one_is_the_same_firing() -> None:
    old = result(firing(T0 + 100, T0 + 2000))
    new = result(firing(T0 + 900, T0 + 2000))
    cmp = backtest(new, old)
    assert [d["seconds"] for d in cmp["timing"]] == [-800.0] and not cmp["only_new"] and not cmp["only_old"], cmp


def test_changed_text_of_matched_firings_and_other_incidents_are_told_apart() -> None:
    other = "network.straggler-retransmits|job=train-llm|node=node-05"
    old = result(firing(T0 + 205, T0 + 300), firing(T0 + 50, T0 + 90, rule="network.straggler-retransmits",
                                                      fp=other))
    new = result(firing(T0 + 205, T0 + 300, title="train-llm: pool scratch reads above 25 ms"))
    cmp = backtest(new, old)
    assert [d["rule_id"] for d in cmp["only_old"]] == ["network.straggler-retransmits"]
    assert [d["changes"]["title"]["new"] for d in cmp["changed"]] == ["train-llm: pool scratch reads above 25 ms"]
    assert cmp["same"] == 0 and not cmp["timing"] and not cmp["only_new"]


# The tester's site rule (pool read latency above 15 ms on most nodes while the job's data wait grew).
SITE_RULE = """\
apiVersion: whywait/v1
id: site.pool-latency-dataload
layer: data
severity: critical
confidence: 0.8
for: 3s
keep_firing_for: 20s
group_by: [job]
labels: {cause: storage.pool-slow, site: dc2}
culprit: "{{ pool }}"
title: "{{ job }}: pool {{ pool }} reads above 15 ms while data loading grows"
cause: >-
  Pool {{ pool }} reads at {{ ev['storage.read_latency_ms'].value | num(1) }} ms on {{ nodes | length }} nodes
  and the job's data wait per step rose to {{ ev['job.data_wait_s'].value | num(2) }} s from
  {{ ev['job.data_wait_s'].baseline | num(3) }} s.
next_step: >-
  Page the storage on-call about pool {{ pool }}.
when:
  all:
    - type: threshold
      name: pool read latency above 15 ms on most nodes
      metric: storage.read_latency_ms
      window: 5s
      value: "> 15"
      min_share: 0.5
      min_entities: 2
      culprit: true
    - type: topology
      name: the slow nodes share a pool
      predicate: share_pool
    - type: self_history
      name: the job's data wait grew
      metric: job.data_wait_s
      agg: median
      window: 5s
      baseline: 300s
      ratio: "> 2"
"""


def test_the_tester_s_mild_then_strong_pool_slowdown_loses_the_first_firing_when_the_threshold_is_raised(
        tmp_path: Path) -> None:
    # `simulate --nodes 8 --duration 700 --seed 5 --fault storage-slow:scratch@200-280,latency_mult=12
    #  --fault storage-slow:scratch@450-530`, replayed without a broker
    old_dir, new_dir = tmp_path / "site", tmp_path / "new-site"
    for d, value in ((old_dir, "> 15"), (new_dir, "> 25")):
        d.mkdir()
        (d / "site.pool-latency-dataload.yaml").write_text(SITE_RULE.replace('value: "> 15"', f'value: "{value}"'))
    topo = make_cluster(nodes=8)
    faults = [parse_fault_spec("storage-slow:scratch@200-280,latency_mult=12"),
              parse_fault_spec("storage-slow:scratch@450-530")]
    msgs = (m for _, m in Simulation(topo, [make_job(topo)], faults, start_time=T0, duration_s=700, seed=5).messages())
    res, old = replay(msgs, load_rules([new_dir]), Topology.from_dict(topo.to_dict()),
                      against=(load_rules([old_dir]), Topology.from_dict(topo.to_dict())))
    assert old is not None
    assert len(incidents(old.diagnoses, old.end)) == 2 and len(incidents(res.diagnoses, res.end)) == 1
    cmp = backtest(res, old)
    assert [(d["firing"], d["firings"]) for d in cmp["only_old"]] == [(1, 2)], cmp
    assert T0 + 200 <= cmp["only_old"][0]["detected_at"] <= T0 + 280
    assert cmp["same"] + len(cmp["timing"]) == 1 and not cmp["only_new"]


def test_the_printed_backtest_counts_firings_and_says_which_firing_was_lost(
        capsys: pytest.CaptureFixture[str]) -> None:
    from whywait.engine.commands.replay_cmd import print_backtest

    old = result(firing(T0 + 205, T0 + 300), firing(T0 + 464, T0 + 550))
    new = result(firing(T0 + 470, T0 + 550))
    print_backtest(backtest(new, old))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("backtest: 0 only in the new rules, 1 only in the old, 1 fire at another time, 0 changed, "
                      "0 the same")
    assert out[1].startswith("  - ") and out[1].endswith("(firing 1 of 2)")
    assert "fires 6 s later" in out[2] and "firing" not in out[2]


def test_a_site_folder_is_replayed_and_backtested_with_the_shipped_rules_named_shipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # `--rules site --against live` replaced the shipped rules, and an installed user knew no path to name them
    from whywait.engine.cli import build_parser
    from whywait.engine.commands.engine_cmd import default_rule_paths
    from whywait.engine.commands.replay_cmd import Plan
    from whywait.engine.rules.loader import shipped_rules_dir

    monkeypatch.delenv("WHYWAIT_SITE_RULES", raising=False)
    site, old_site = tmp_path / "site-rules", tmp_path / "site-rules-old"
    parser = build_parser("replay")
    plan = Plan(parser.parse_args(["replay", "--since", "-2h", "--rules", "shipped", "--rules", str(site),
                                   "--against", "live"]), tmp_path)
    assert plan.rules_paths == [shipped_rules_dir(), site] and plan.against == default_rule_paths()
    plan = Plan(parser.parse_args(["replay", "--since", "-2h", "--rules", "shipped", "--rules", str(site),
                                   "--against", "shipped", "--against", str(old_site)]), tmp_path)
    assert plan.against == [shipped_rules_dir(), old_site]
    from whywait.engine.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # one line per option: argparse breaks lines at a hyphen
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--rules shipped --rules site-rules/" in text and "(repeatable, like --rules: --against shipped" in text
