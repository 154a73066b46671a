"""What a new user met in session 22's pass: a replay of a window holding no data said only "0 incident(s)" (now it
says where the topics' data lies), and a time in milliseconds was "not a time between the years 1 and 9999"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from whywait.engine.commands.replay_cmd import parse_time
from whywait.engine.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("given", "unit"), [("1796400000000", "milliseconds"), ("1796400000000000", "microseconds"),
                                             ("1796400000000000000", "nanoseconds")])
def test_a_time_in_milliseconds_is_refused_naming_the_time_in_seconds(given: str, unit: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_time(given, what="--since")
    assert str(e.value) == (f"--since: {given!r} looks like {unit} since the epoch; in seconds it is 1796400000 "
                            "(2026-12-04 16:00:00 UTC): give Unix seconds")


def test_seconds_and_far_times_are_as_before() -> None:
    assert parse_time("1796400000") == 1796400000.0
    with pytest.raises(ConfigError, match="not a time between the years 1 and 9999"):
        parse_time("1e400", what="--since")


@pytest.mark.integration
def test_a_window_without_data_says_where_the_data_is(kafka_bootstrap: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK")}
    env["WHYWAIT_KAFKA_BOOTSTRAP"] = kafka_bootstrap
    run = [sys.executable, "-m", "whywait"]
    sim = subprocess.run(run + ["simulate", "--nodes", "2", "--duration", "5", "--speed", "0", "--start-time",
                                "1780000000"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert sim.returncode == 0, sim.stderr
    # A window in 2001: nothing there, every record of the topics is after it.
    r = subprocess.run(run + ["replay", "--since", "2001-09-09T00:00:00Z", "--until", "2001-09-09T01:00:00Z"],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    note = next(line for line in r.stdout.splitlines() if "no telemetry in the window" in line)
    assert "the input topics hold records from" in note and "after it: is the window right?" in note, note
    assert "Traceback" not in r.stderr


def test_replay_takes_another_name_of_a_topology_host_as_the_engine_does(tmp_path: Path) -> None:
    # The topology names node-05.cluster.local, the agents and placements node-05: the engine resolves it, and
    # the replay counted every sample as "telemetry from a node the topology does not hold".
    import re

    from whywait.agents.events import encode
    from whywait.engine.commands.engine_cmd import load_topology
    from whywait.engine.replay import EventTimeMerge, Window, replay
    from whywait.engine.rules.loader import load_rules
    from whywait.simulate.cluster import make_cluster, make_job
    from whywait.simulate.faults import make_fault
    from whywait.simulate.sim import Simulation

    topo = make_cluster(nodes=8)
    plain = tmp_path / "plain.yaml"
    topo.to_yaml(plain, include_jobs=False)
    fqdn = tmp_path / "fqdn.yaml"
    fqdn.write_text(re.sub(r"\bnode-(\d\d)\b", r"node-\1.cluster.local", plain.read_text()))
    start = 1_700_000_000.0
    sim = Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", "node-05", 60, 200)],
                     start_time=start, duration_s=240, seed=4)
    msgs = list(sim.messages())
    msgs.append(("whywait.host.v1", {**next(m for _, m in msgs if m["kind"] == "host"), "node": "node-5"}))  # a typo
    w = Window(start, start + 240)
    merge = EventTimeMerge(["s"], w)
    for topic, m in sorted(msgs, key=lambda tm: tm[1]["time"]):
        merge.add("s", topic, [encode(m)])
    res, _ = replay(merge.drain(), load_rules([REPO / "rules"]), load_topology(fqdn))
    assert any(d.rule_id == "network.straggler-retransmits" and d.culprit == "node-05.cluster.local"
               for d in res.diagnoses), [(d.rule_id, d.culprit) for d in res.diagnoses]
    assert sum(res.skipped.values()) == 1, res.skipped  # the typo alone, said with the hosts like it
    (why,) = res.skipped
    assert why.startswith("telemetry from a node the topology does not hold: 'node-5' is not in the topology")
    assert "node-05.cluster.local" in why
