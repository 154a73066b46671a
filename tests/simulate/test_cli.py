"""``whywait simulate --dry-run``: JSON lines on stdout, topology and truth files; errors as one line."""

from __future__ import annotations

import json

import yaml
from whywait.agents.events import validate
from whywait.engine.cli import main
from whywait.topology import Topology


def test_dry_run_prints_valid_json_lines_and_writes_truth_and_topology(tmp_path, capsys):
    topo_out, truth_out = tmp_path / "topo.yaml", tmp_path / "truth.json"
    rc = main(["simulate", "--dry-run", "--speed", "0", "--nodes", "4", "--duration", "10", "--seed", "2",
               "--start-time", "1764442800", "--fault", "nic-packet-loss:node-03@2-8,slowdown=1.2",
               "--topology-out", str(topo_out), "--truth-out", str(truth_out)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    msgs = [json.loads(line) for line in lines]
    for m in msgs:
        validate(m)
    assert msgs[0]["kind"] == "placement"
    assert {m["kind"] for m in msgs} >= {"placement", "gpu", "net", "storage", "host", "steps"}
    assert len([m for m in msgs if m["kind"] == "gpu"]) == 4 * 10
    truth = json.loads(truth_out.read_text())
    assert truth[0]["culprit"] == "node-03" and truth[0]["start"] == 1764442802.0
    assert truth[0]["detail"]["slowdown"] == 1.2
    topo = Topology.from_yaml(topo_out)
    assert topo.nodes() == ("node-01", "node-02", "node-03", "node-04")
    assert topo.job("train-llm").world_size == 32
    assert yaml.safe_load(topo_out.read_text())["format"] == 1


def test_bad_fault_spec_is_one_line(capsys):
    rc = main(["simulate", "--dry-run", "--fault", "nic-packet-loss:node-99@1-2"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err == ("whywait simulate: fault 'nic-packet-loss': unknown node 'node-99' "
                   "(cluster: node-01 … node-16)\n")


def test_unknown_fault_lists_the_valid_ones(capsys):
    assert main(["simulate", "--dry-run", "--fault", "meteor:node-01@1-2"]) == 2
    assert "unknown fault 'meteor' (valid: " in capsys.readouterr().err


def test_unreachable_broker_is_one_line(capsys):
    rc = main(["simulate", "--speed", "0", "--nodes", "2", "--duration", "2", "--bootstrap", "127.0.0.1:1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("whywait simulate: Kafka at 127.0.0.1:1 is unreachable") and err.count("\n") == 1
    assert "Traceback" not in err


def test_scenario_with_flag_overrides(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("seed: 4\nduration_s: 100\ncluster: {nodes: 2}\n"
                        "faults:\n  - {fault: cpu-bound-loader, target: node-02, start: 1, end: 3}\n")
    truth = tmp_path / "truth.json"
    assert main(["simulate", "--dry-run", "--speed", "0", "--scenario", str(scenario), "--duration", "4",
                 "--start-time", "1000", "--truth-out", str(truth)]) == 0
    msgs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert max(m["time"] for m in msgs) == 1004.0
    assert json.loads(truth.read_text())[0]["cause"] == "data-loader.cpu-bound"


def test_real_time_pacing(capsys):
    import time

    t0 = time.monotonic()
    assert main(["simulate", "--dry-run", "--speed", "20", "--nodes", "1", "--duration", "2"]) == 0
    assert time.monotonic() - t0 >= 2 / 20 * 0.9
    assert capsys.readouterr().out.count("\n") > 5
