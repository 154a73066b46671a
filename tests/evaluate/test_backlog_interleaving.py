"""Diagnoses depend on event time, not on how the consumer's fetches interleave the topics.

A live engine catching up on a backlog reads each topic's partition in chunks (up to thousands of
records per fetch), so one topic can run minutes of event time ahead of the others.  Fed the same
messages in produce order and in large per-topic chunks, the evaluator must announce the same
incidents at the same event times.  (This failed with the columnar store before points far ahead of
the evaluation clock were kept staged: the fuzz test's detection moved from 8 s to 16 s.)
"""

from __future__ import annotations

from typing import Any

import pytest
from whywait.agents.events import decode, encode, kind_for_topic
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.simulate.cluster import make_cluster, make_job
from whywait.simulate.faults import make_fault
from whywait.simulate.sim import Simulation
from whywait.topology.model import Topology

START = 1_700_000_000.0
FAULT = (60, 150)


def _run(chunk: int | None, start: float = START) -> list[tuple[str, str, str | None, float]]:
    """Feed one simulated packet-loss fault; ``chunk``: records per topic per batch (None: produce order)."""
    topo = make_cluster(nodes=8)
    sim = Simulation(topo, [make_job(topo, job="j", channel="#x")],
                     [make_fault("nic-packet-loss", "node-03", *FAULT)], start_time=start, duration_s=200, seed=7)
    msgs = [(tp, decode(encode(m), tp)) for tp, m in sim.messages()]
    clock = [0.0]
    ev = Evaluator(load_rules(["rules"]), Topology.from_dict(topo.to_dict()), arrival_clock=lambda: clock[0])
    out: list[Any] = []
    if chunk is None:
        batches = [[m for _, m in msgs[i:i + 100]] for i in range(0, len(msgs), 100)]
        pending: list[set[str]] = [set() for _ in batches]
    else:
        queues: dict[str, list[Any]] = {}
        for tp, m in msgs:
            queues.setdefault(tp, []).append(m)
        batches, pending = [], []
        while any(queues.values()):
            batch: list[Any] = []
            for tp in queues:  # a fetch: up to ``chunk`` records of every topic, topic after topic
                batch += queues[tp][:chunk]
                queues[tp] = queues[tp][chunk:]
            batches.append(batch)
            pending.append({k for tp, q in queues.items() if q and (k := kind_for_topic(tp))})
    for batch, left in zip(batches, pending, strict=True):
        ev.begin_batch()
        for m in batch:
            out += ev.ingest(m)
        clock[0] += 0.05
        ev.set_pending(left)
        out += ev.catch_up()
    return [(d.rule_id, d.status, d.culprit, d.detected_at - start) for d in out]


# Where the seconds fall against the store's 30 s buckets changes what a wrapped ring loses: several offsets.
@pytest.mark.parametrize("offset", [0, 17, 50])
@pytest.mark.parametrize("chunk", [5000])
def test_same_incidents_at_the_same_event_times_whatever_the_fetch_sizes(chunk: int, offset: int) -> None:
    ordered = _run(None, START + offset)
    assert any(r == "network.straggler-retransmits" and s == "firing" and c == "node-03" for r, s, c, _ in ordered)
    assert _run(chunk, START + offset) == ordered
