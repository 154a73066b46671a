"""A rule test's scenario is bounded, and what only its simulation finds is refused at its line before any case runs.

``duration_s: 99999999999`` ran forever and ``cluster: {nodes: 100000000}`` took gigabytes; an unknown fault target
and ``nodes: 0`` were reported without their file and line.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from whywait.simulate.ruletest import RuleTestError, load_cases
from whywait.simulate.scenario import parse_scenario


def problems(tmp_path: Path, case: str) -> list[str]:
    f = tmp_path / "x.test.yaml"
    f.write_text("cases:\n- name: c\n" + case + "  expect: []\n")
    t0 = time.perf_counter()
    with pytest.raises(RuleTestError) as exc:
        load_cases(f)
    assert time.perf_counter() - t0 < 10
    return [p.replace(str(f), "F") for p in exc.value.problems]


@pytest.mark.parametrize("case, want", [
    ("  scenario: {duration_s: 99999999999}\n",
     "F:3: cases[0].scenario.duration_s: must be at most 86,400 s (one day) of event time in a rule test "
     "(got 99999999999)"),
    ("  scenario: {duration_s: 86400, interval_s: 0.01}\n",
     "F:3: cases[0].scenario.interval_s: duration_s / interval_s is 8,640,000 samples; a rule test simulates at most "
     "86,400 (a longer interval_s or a shorter duration_s)"),
    ("  scenario:\n    cluster: {nodes: 100000000}\n",
     "F:4: cases[0].scenario.cluster.nodes: must be at most 20,000 in a rule test (got 100000000)"),
    ("  scenario:\n    cluster: {nodes: 2, gpus_per_node: 100000000}\n",
     "F:4: cases[0].scenario.cluster.gpus_per_node: must be at most 256 in a rule test (got 100000000)"),
    ("  scenario:\n    duration_s: 86400\n    cluster: {nodes: 64}\n",
     "F:4: cases[0].scenario.duration_s: 64 nodes for 86,400 samples is 5,529,600 node-samples; a rule test "
     "simulates at most 2,000,000 (fewer nodes or a shorter duration_s)"),
    ("  scenario:\n    cluster: {nodes: 8}\n    jobs: [{job: a, step_s: 0.0001}]\n",
     "F:5: cases[0].scenario.jobs[0]: job 'a': 64 ranks for 6,452,845 steps of 9.3e-05 s; a rule test simulates "
     "at most 20,000,000 rank-steps per job"),
    ("  scenario:\n    cluster: {nodes: 8}\n    jobs: [{job: a, nodes: node-01..node-99999999}]\n",
     "F:5: cases[0].scenario.jobs[0].nodes: node-01..node-99999999 names 99,999,999 nodes; the cluster has 8"),
    ("  events:\n  - {at: 99999999999, kind: host, node: node-01, cpu_busy_pct: 1.0, cpu_iowait_pct: 0.0,"
     " mem_used_bytes: 1, mem_total_bytes: 2}\n",
     "F:4: cases[0].events[0].at: must be at most 86,400s (one day) after the start (got 99,999,999,999s)"),
])
def test_a_scenario_too_big_for_a_rule_test_is_refused_at_its_line(tmp_path: Path, case: str, want: str) -> None:
    assert problems(tmp_path, case) == [want]


def test_an_unknown_fault_target_and_an_empty_cluster_name_their_line_once(tmp_path: Path) -> None:
    case = ("  scenario:\n    duration_s: 180\n    cluster: {nodes: 8}\n    faults:\n"
            "    - {fault: nic-packet-loss, target: node-03, start: 10, end: 20}\n"
            "    - {fault: link-flap, target: node-99, start: 100, end: 160}\n"
            "  expect: []\n- name: d\n  scenario:\n    cluster: {nodes: 0}\n")
    assert problems(tmp_path, case) == [
        "F:8: cases[0].scenario.faults[1]: fault 'link-flap': unknown node 'node-99' (cluster: node-01 … node-08)",
        "F:12: cases[1].scenario.cluster: nodes, gpus_per_node, nodes_per_leaf and nics_per_node must be ≥ 1, "
        "spines ≥ 0 (got nodes=0, gpus_per_node=8, nodes_per_leaf=4, spines=2, nics_per_node=4)"]


def test_a_fault_after_the_end_is_refused_before_anything_runs(tmp_path: Path) -> None:
    case = ("  scenario:\n    duration_s: 60\n    faults:\n"
            "    - {fault: link-flap, target: node-01, start: 100, end: 160}\n")
    assert problems(tmp_path, case) == [
        "F:6: cases[0].scenario.faults[0]: fault 'link-flap' on node-01: starts at 100s, after the simulation ends "
        "(60s)"]


def test_the_simulator_itself_still_takes_any_size() -> None:
    sc = parse_scenario({"duration_s": 7 * 86_400, "cluster": {"nodes": 2}}, "s.yaml")
    assert sc.duration_s == 7 * 86_400
