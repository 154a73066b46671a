"""Scenario files: the shipped examples load and run; malformed ones fail with the key path."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from whywait.agents.events import validate
from whywait.simulate.errors import SimulationError
from whywait.simulate.scenario import expand_nodes, load_scenario, parse_scenario
from whywait.simulate.sim import Simulation

SCENARIOS = Path(__file__).resolve().parents[2] / "simulate" / "scenarios"


def test_shipped_scenarios_load_and_validate():
    for path in sorted(SCENARIOS.glob("*.yaml")):
        sc = load_scenario(path)
        sim = Simulation(sc.topology, sc.jobs, sc.faults, start_time=1e9, duration_s=sc.duration_s,
                         interval_s=sc.interval_s, seed=sc.seed)
        for topic, msg in itertools.islice(sim.messages(), 3000):  # generation is lazy: the first ~30 s
            validate(msg, topic)
        assert sim.ground_truth(), path


def test_noisy_neighbour_scenario():
    sc = load_scenario(SCENARIOS / "noisy-neighbour.yaml")
    assert [j.job for j in sc.jobs] == ["train-llm", "batch-etl"]
    assert sc.jobs[1].nodes == ("node-07", "node-08") and sc.jobs[1].checkpoint_every_s == 0
    assert [f.name for f in sc.faults] == ["contention", "contention", "gpu-thermal"]
    assert sc.faults[2].params["temp_c"] == 94
    sim = Simulation(sc.topology, sc.jobs, sc.faults, duration_s=sc.duration_s, seed=sc.seed)
    truth = sim.ground_truth()
    assert [(g.cause, g.culprit, g.job) for g in truth] == [
        ("contention.network", "batch-etl", "train-llm"),
        ("contention.storage", "batch-etl", "train-llm"),
        ("gpu.thermal-throttle", "node-03 gpu 5", "train-llm")]


def test_stragglers_scenario_sets_the_parallel_layout_and_mixed_hardware():
    sc = load_scenario(SCENARIOS / "stragglers.yaml")
    llm, pp = sc.jobs
    assert llm.slow_nodes == ("node-07", "node-08") and llm.step_s == 2 and llm.pp == 1
    assert (pp.pp, pp.tp, pp.dp, pp.microbatches) == (4, 8, 2, 8)
    assert [f.name for f in sc.faults] == ["straggler-compute", "multi-straggler", "stage-imbalance"]


def test_topology_file_instead_of_cluster(tmp_path):
    topo = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "small.yaml"
    sc = parse_scenario({"topology": str(topo), "jobs": [{"job": "a", "nodes": ["gpu-a1"]}]}, "s.yaml")
    assert sc.jobs[0].ranks == {0: ("gpu-a1", 0), 1: ("gpu-a1", 1), 2: ("gpu-a1", 2), 3: ("gpu-a1", 3)}


@pytest.mark.parametrize("data, message", [
    ({"faults": [{"fault": "nic-packet-loss", "target": "node-01", "start": 1}]},
     "s.yaml: faults[0]: missing end"),
    ({"faults": [{"fault": "nic-packet-loss", "target": "node-01", "start": 1, "end": 2, "when": 3}]},
     "s.yaml: faults[0]: unknown key(s) when (valid: end, fault, params, start, target)"),
    ({"faults": [{"fault": "gpu-thermal", "target": "node-01:gpu1", "start": 1, "end": 2,
                  "params": {"temp": 99}}]},
     "s.yaml: faults[0]: fault 'gpu-thermal': unknown parameter(s) temp (valid: compute_mult, sm_clock_mhz, temp_c)"),
    ({"cluster": {"nodes": 4, "racks": 2}}, "s.yaml: cluster: unknown key(s) racks (valid: "),
    ({"jobs": [{"job": "a", "nodes": "node-01..node-99"}], "cluster": {"nodes": 4}},
     "s.yaml: jobs[0]: job 'a': unknown node 'node-05'"),
    ({"jobs": [{"job": "a", "warp": 9}]}, "s.yaml: jobs[0]: job 'a': unknown setting(s) warp (valid: "),
    ({"jobs": [{"job": "a", "pp": "two"}]}, "s.yaml: jobs[0]: job 'a': pp must be an integer ≥ 1 (got 'two')"),
    ({"jobs": [{"job": "a", "split": "no"}]}, "s.yaml: jobs[0]: job 'a': split must be true or false (got 'no')"),
    ({"jobs": [{"job": "a", "slow_nodes": "node-01..node-20"}], "cluster": {"nodes": 4}},
     "s.yaml: jobs[0]: job 'a': slow_nodes node-05, node-06"),
    ({"jobs": [{"job": "a", "slow_nodes": 7}]}, "s.yaml: jobs[0].slow_nodes: expected a node list"),
    ({"seed": "x"}, "s.yaml: seed: expected an integer (got 'x')"),
    ({"duration_s": 0}, "s.yaml: duration_s: expected a positive number of seconds (got 0)"),
    ({"nodes": 3}, "s.yaml: unknown key(s) nodes (valid: "),
])
def test_malformed_scenarios(data, message):
    with pytest.raises(SimulationError) as info:
        parse_scenario(data, "s.yaml")
    assert str(info.value).startswith(message)


def test_node_ranges():
    assert expand_nodes("node-01..node-03", "x") == ["node-01", "node-02", "node-03"]
    assert expand_nodes(["a", "b"], "x") == ["a", "b"]
    assert expand_nodes(None, "x") is None
    with pytest.raises(SimulationError, match="x: expected a node list"):
        expand_nodes(3, "x")
