"""Most of a cluster going dark at once is told, not taken for the data ending.

The node absence condition (``job.node-unseen``) must not judge nodes in the ticks a replay or a rule
test runs after its data ended; until session 24 it took "fewer than half of the nodes reported in the
last 5 s" for that end, so a job on 16 of 24 nodes whose agents all lost Kafka at once gave no diagnosis
at all.  The data's end leaves no node reporting (or one whose clock runs ahead); these leave eight.
"""

from __future__ import annotations

from pathlib import Path

from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

RULES = Path(__file__).resolve().parents[2] / "rules"
START = 1_764_442_800.0


def test_sixteen_of_twenty_four_nodes_going_dark_are_each_told_and_nothing_else() -> None:
    topo = make_cluster(nodes=24)
    infra = Topology.from_dict(topo.to_dict())
    faults = [make_fault("agent-down", f"node-{i:02d}", 100, 250) for i in range(1, 17)]
    sim = Simulation(topo, [make_job(topo)], faults, start_time=START, duration_s=300, seed=2)
    msgs = sorted((m for _, m in sim.messages()), key=lambda m: m["time"])
    ev = Evaluator(load_rules([RULES]), infra)
    fired = [d for m in msgs for d in ev.ingest(m) if d.status == "firing"]
    assert {d.rule_id for d in fired} == {"job.node-unseen"}
    assert sorted(d.labels["node"] for d in fired) == [f"node-{i:02d}" for i in range(1, 17)]
    assert all(130 <= d.detected_at - START <= 136 for d in fired), [d.detected_at - START for d in fired]
