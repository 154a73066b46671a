"""Replay for postmortems: the pure replay, its incident spans and the timeline plot; then through Kafka."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from agents.simulate.cluster import make_cluster, make_job
from agents.simulate.faults import make_fault
from agents.simulate.sim import Simulation
from engine.commands.replay_cmd import parse_time
from engine.replay import incidents, plot_timeline, replay
from engine.rules.loader import load_rules
from topology.model import Topology

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules"


def sim(start: float, nodes: int = 8) -> tuple[Topology, Simulation]:
    topo = make_cluster(nodes=nodes)
    infra = Topology.from_dict(topo.to_dict())
    s = Simulation(topo, [make_job(topo)], [make_fault("nic-packet-loss", "node-05", 120, 200)],
                   start_time=start, duration_s=260, seed=2)
    return infra, s


def test_replay_finds_the_incident_and_plots_it(tmp_path: Path) -> None:
    infra, s = sim(1_764_442_800.0)
    res = replay((m for _, m in s.messages()), load_rules([RULES]), infra)
    spans = incidents(res.diagnoses, res.end)
    net = [sp for sp in spans if sp[0].rule_id == "network.straggler-retransmits"]
    assert len(net) == 1
    d, a, b = net[0]
    assert d.culprit == "node-05" and 1_764_442_800 + 118 <= a <= 1_764_442_800 + 130
    assert 1_764_442_800 + 195 <= b <= 1_764_442_800 + 240
    png = plot_timeline(res, tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_parse_time() -> None:
    assert parse_time("-2h", now=10_000.0) == 2_800.0
    assert parse_time("1764442800") == 1_764_442_800.0
    assert parse_time("2025-11-29T19:00:00Z") == 1_764_442_800.0


@pytest.mark.integration
def test_whywait_replay_over_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    from engine.stream.topics import ensure_topics
    from tests.support.kafka import publish_messages

    start = 2_100_000_000.0  # its own stretch of event time, after every other test's
    infra, s = sim(start)
    ensure_topics(kafka_bootstrap)

    asyncio.run(publish_messages(kafka_bootstrap, list(s.messages())))
    topo = tmp_path / "topology.yaml"
    infra.to_yaml(topo)
    r = subprocess.run([sys.executable, "-m", "engine.cli", "replay", "--bootstrap", kafka_bootstrap,
                        "--topology", str(topo), "--since", str(start), "--until", str(start + 260),
                        "--lead", "0s", "--plot", str(tmp_path / "t.png"), "--json", str(tmp_path / "d.jsonl")],
                       capture_output=True, text=True, cwd=REPO, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "network.straggler-retransmits  node-05" in r.stdout, r.stdout
    assert (tmp_path / "t.png").stat().st_size > 20_000
    assert (tmp_path / "d.jsonl").read_text().count('"rule_id"') >= 2
