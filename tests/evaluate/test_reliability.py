"""The evaluator against restarts and hostile time: restored incidents wait for data, time cannot be hijacked.

Driven by the simulator's ground truth at fixed event times (no Kafka): a packet-loss fault on
node-04 from +120 s to +330 s, a thermal fault on node-06 from +380 s to +470 s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from whywait.agents.events import envelope
from whywait.engine.diagnosis import Diagnosis
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

RULES = Path(__file__).resolve().parents[2] / "rules"
START = 1_700_000_000.0
RULE = "network.straggler-retransmits"


@pytest.fixture(scope="module")
def scenario() -> tuple[Any, list[dict[str, Any]]]:
    topo = make_cluster(nodes=8)
    sim = Simulation(topo, [make_job(topo, job="j", channel="#ml")],
                     [make_fault("nic-packet-loss", "node-04", 120, 330),
                      make_fault("gpu-thermal", "node-06", 380, 470)],
                     start_time=START, duration_s=520, seed=4)
    return topo, [m for _, m in sim.messages()]


def fresh(topo: Any, msgs: list[dict[str, Any]]) -> Evaluator:
    ev = Evaluator(load_rules([RULES]), Topology.from_dict(topo.to_dict()))
    for m in msgs:
        if m["kind"] == "placement":  # what the engine reads from the compacted topic at start-up
            ev.topology.apply_placement(m)
    return ev


def events(diags: list[Diagnosis]) -> list[tuple[str, str | None, str, float]]:
    return [(d.rule_id, d.culprit, d.status, round((d.ends_at or d.detected_at) - START)) for d in diags]


def feed(ev: Evaluator, msgs: list[dict[str, Any]]) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    for m in msgs:
        out += ev.ingest(m)
    return out


def test_restart_mid_fault_behaves_like_no_restart(scenario: Any) -> None:
    topo, msgs = scenario
    whole = feed(fresh(topo, msgs), msgs)
    before = [m for m in msgs if m["time"] < START + 220]
    after = [m for m in msgs if m["time"] >= START + 220]
    a = fresh(topo, msgs)
    first = feed(a, before)
    b = fresh(topo, msgs)
    b.restore(a.snapshot())
    assert events(first + feed(b, after)) == events(whole)
    assert ("gpu.thermal-throttle", "node-06", "firing", 386) in events(whole)  # a new fault after the restart


def test_restored_incident_waits_for_its_node_instead_of_resolving(scenario: Any) -> None:
    """node-04's agent is behind after the restart: its absence is unknown, not "the fault is over"."""
    topo, msgs = scenario
    a = fresh(topo, msgs)
    feed(a, [m for m in msgs if m["time"] < START + 220])
    b = fresh(topo, msgs)
    b.restore(a.snapshot())
    gap = [m for m in msgs if m["time"] >= START + 220
           and not (m["node"] == "node-04" and m["time"] < START + 280)]
    resolved = [e for e in events(feed(b, gap)) if e[0] == RULE and e[2] == "resolved"]
    assert resolved == [(RULE, "node-04", "resolved", 354)]  # the fault's end + keep_firing_for, as without a gap


def test_without_restore_the_same_gap_would_resolve_early(scenario: Any) -> None:
    """The control for the test above: a live (not restored) incident with the same gap resolves at once."""
    topo, msgs = scenario
    ev = fresh(topo, msgs)
    gap = [m for m in msgs if not (m["node"] == "node-04" and START + 220 <= m["time"] < START + 280)]
    resolved = [e for e in events(feed(ev, gap)) if e[0] == RULE and e[2] == "resolved"]
    assert resolved and resolved[0][3] < 300


def host(node: str, t: float) -> dict[str, Any]:
    return envelope("host", node, t, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=1, mem_total_bytes=2)


def test_future_message_is_refused_and_the_node_reported() -> None:
    ev = Evaluator(load_rules([RULES]), make_cluster(nodes=2, gpus_per_node=1))
    now = time.time()
    assert ev.admit(host("node-01", now + 10), now) is None
    why = ev.admit(host("node-02", now + 86_400), now)
    assert why is not None and "86400s ahead of the engine's clock (limit 300s)" in why
    [d] = ev.clock_diagnoses(now)
    assert d.status == "firing" and d.culprit == "node-02" and d.job is None
    assert ev.clock_diagnoses(now + 1) == []  # announced once
    [r] = ev.clock_diagnoses(now + 200)
    assert r.status == "resolved" and r.fingerprint == d.fingerprint


def test_skew_limit_can_be_switched_off_for_simulations() -> None:
    ev = Evaluator(load_rules([RULES]), make_cluster(nodes=2, gpus_per_node=1), max_skew_s=None)
    assert ev.admit(host("node-01", time.time() + 86_400 * 365), time.time()) is None


def test_one_batch_runs_a_bounded_number_of_ticks_and_gaps_are_skipped() -> None:
    ev = Evaluator(load_rules([RULES]), make_cluster(nodes=2, gpus_per_node=1), max_ticks_per_batch=50)
    ev.begin_batch()
    for t in range(10):
        ev.ingest(host("node-01", START + t))
        ev.ingest(host("node-02", START + t))
    ticks = ev.ticks
    ev.begin_batch()
    t0 = time.perf_counter()
    ev.ingest(host("node-01", 1e10))  # a day... a few centuries ahead, in one message
    ev.ingest(host("node-02", 1e10))
    assert time.perf_counter() - t0 < 5.0
    assert ev.ticks - ticks <= 50
    assert ev.skipped_gap_s > 1e9
    ev.begin_batch()
    ev.catch_up()
    assert ev.next_tick is not None and ev.next_tick > 1e10 - 2000


def test_an_incident_resolved_after_a_skipped_gap_ended_when_it_stopped_holding(scenario: Any) -> None:
    # The data ends mid-fault (as a replay's range does) and the clock is then moved an hour on: the
    # gap is skipped, and the first tick after it resolves the incident.  It ended when its
    # keep_firing_for ran out after the condition last held, not at that tick, 45 minutes later.
    topo, msgs = scenario
    ev = fresh(topo, msgs)
    out = feed(ev, [m for m in msgs if m["time"] < START + 300])
    [inc] = [i for i in ev.incidents.values() if i.rule_id == RULE and i.firing]
    last_true = inc.last_true
    keep = ev.rules.rules[RULE].keep_firing_for_s
    out += ev.advance(START + 300 + 3600)
    assert ev.skipped_gap_s > 0
    [done] = [d for d in out if d.rule_id == RULE and d.status == "resolved"]
    assert done.ends_at is not None
    assert done.ends_at == last_true + max(keep, ev.step_s), (done.ends_at - START, last_true - START, keep)
    assert done.ends_at < START + 300 + keep + 2
