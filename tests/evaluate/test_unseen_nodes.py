"""What a diagnosis says of a node whose hardware whywait never saw (an imported step table, no agent)."""

from __future__ import annotations

from pathlib import Path

from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate import Simulation, make_fault
from whywait.simulate.cluster import make_cluster, make_job

RULES = Path(__file__).resolve().parents[2] / "rules"


def _straggler(steps_only: bool) -> str:
    topo = make_cluster(nodes=4)
    sim = Simulation(topo, [make_job(topo)], [make_fault("straggler-compute", "train-llm:9", 60, 180)],
                     start_time=1_700_000_000.0, duration_s=180, seed=3)
    ev = Evaluator(load_rules([RULES]), topo)
    diags = []
    for _, m in sim.messages():
        if not steps_only or m["kind"] in ("placement", "steps"):
            diags += ev.ingest(m)
    [d] = [d for d in diags if d.rule_id == "job.straggler" and d.status == "firing"][:1]
    return d.title + " | " + d.cause


def test_a_straggler_seen_through_its_steps_only_does_not_claim_its_hardware_was_ruled_out() -> None:
    # A tester's imported step table: the text said "No throttling, XID, packet loss, storage or CPU signature
    # explains it" although whywait had no telemetry from any node.
    text = _straggler(steps_only=True)
    assert "whywait has no telemetry from node-02 (its steps only)" in text, text
    assert "its hardware unseen" in text and "No throttling" not in text, text
    live = _straggler(steps_only=False)
    assert "No throttling, XID, packet loss, storage or CPU signature explains it." in live, live
    assert "no hardware cause seen" in live, live
