"""The stream processor without Kafka: decode, dead-letter, skip, evaluate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from whywait.agents.events import TOPIC_HOST, TOPIC_PLACEMENT, encode, envelope
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.engine.stream.processor import Processor, Record
from whywait.simulate.cluster import make_cluster

RULES = Path(__file__).resolve().parents[2] / "rules"


def proc(not_before: float | None = None) -> Processor:
    return Processor(Evaluator(load_rules([RULES]), make_cluster(nodes=2, gpus_per_node=1)), not_before)


def host(t: float) -> bytes:
    return encode(envelope("host", "node-01", t, cpu_busy_pct=1.0, cpu_iowait_pct=0.0, mem_used_bytes=1,
                           mem_total_bytes=2))


def test_bad_messages_become_dead_letters_with_their_reason_and_bytes() -> None:
    p = proc()
    out = p.process([Record(TOPIC_HOST, b"\xff\xfe", b"k", 0, 7), Record(TOPIC_HOST, b'{"schema": 1}', None, 0, 8),
                     Record(TOPIC_HOST, host(100.0), b"node-01", 0, 9)])
    assert len(out.dead_letters) == 2 and p.counts["messages"] == 1
    first = json.loads(out.dead_letters[0][1])
    assert out.dead_letters[0][0] == TOPIC_HOST.encode()
    assert first["offset"] == 7 and first["value"] is None and first["value_base64"] == "//4="
    assert first["reason"].startswith("not valid JSON")
    second = json.loads(out.dead_letters[1][1])
    assert second["reason"] == "kind: is required (string); time: is required (number); node: is required (string)"


def test_placement_on_an_unknown_node_is_dead_lettered_not_fatal() -> None:
    p = proc()
    msg = envelope("placement", "sched", 100.0, job="j", project="p", team="t", state="running",
                   ranks=[{"rank": 0, "node": "node-99", "gpu": 0}])
    out = p.process([Record(TOPIC_PLACEMENT, encode(msg))])
    assert len(out.dead_letters) == 1
    assert json.loads(out.dead_letters[0][1])["reason"].startswith("topology: ")
    out = p.process([Record(TOPIC_HOST, host(101.0))])  # and it keeps going
    assert p.counts["messages"] == 1


def test_messages_before_not_before_are_skipped_and_tombstones_ignored() -> None:
    p = proc(not_before=1000.0)
    p.process([Record(TOPIC_HOST, host(999.0)), Record(TOPIC_HOST, host(1000.0)), Record(TOPIC_PLACEMENT, None)])
    assert p.counts["skipped_before_start"] == 1 and p.counts["messages"] == 1 and p.counts["tombstones"] == 1


def _run(start: float, duration: float, faults: list[Any] | None = None) -> list[tuple[str, bytes]]:
    from whywait.simulate import Simulation
    from whywait.simulate.cluster import make_job

    topo = make_cluster(nodes=8)
    sim = Simulation(topo, [make_job(topo)], faults or [], start_time=start, duration_s=duration, seed=3)
    return [(topic, encode(m)) for topic, m in sim.messages()]


def _unseen_after_restoring(old: list[tuple[str, bytes]], new: list[tuple[str, bytes]], start: float,
                            late_node: str | None = None, late_s: float = 0.0) -> list[Any]:
    """A partitioned worker that gained its job's partition: it re-reads ``old`` (the window before the group's
    commit) into its store, then evaluates ``new``, the run it was started for (``--not-before start``), where
    ``late_node``'s first ``late_s`` of telemetry reach it late (routed by another, busier worker).  Returns
    the firing job.node-unseen diagnoses."""
    p = Processor(Evaluator(load_rules([RULES]), make_cluster(nodes=8)), not_before=start)
    p.restore(old)
    held: list[Record] = []
    diags = []
    for topic, value in new:
        m = json.loads(value)
        if m.get("node") == late_node and m["time"] < start + late_s:
            held.append(Record(topic, value))
            continue
        if held and m["time"] >= start + late_s:
            diags += p.process(held).diagnoses
            held = []
        diags += p.process([Record(topic, value)]).diagnoses
    return [d for d in diags if d.rule_id == "job.node-unseen" and d.status == "firing"]


def test_a_restore_skips_history_before_not_before() -> None:
    # The scale-out test's runs share topics, each at its own stretch of event time: a worker gaining a
    # partition re-read the previous run's telemetry, days old, into the store of this one.
    p = proc(not_before=1000.0)
    assert p.restore([(TOPIC_HOST, host(999.0)), (TOPIC_HOST, host(1000.0))]) == 1
    assert p.counts["restore.skipped_before_start"] == 1
    assert p.evaluator.store.telemetry_since() == 1000.0 and list(p.evaluator.store.node_seen["node-01"].t) == [1000.0]


def test_a_node_whose_telemetry_is_still_being_routed_is_not_unseen_after_a_restore() -> None:
    # The 3-worker scale-out run's false job.node-unseen on node-06 (the only node of train-llm on its input
    # partition, so routed by another worker than the other five): the worker evaluating train-llm had re-read
    # an earlier run's window, so at its first tick node-06 looked silent for two days.
    start = 1_700_000_000.0 + 2 * 86_400
    old = _run(start - 2 * 86_400, 60)
    assert _unseen_after_restoring(old, _run(start, 60), start, "node-06", 6.0) == []
    # A node whose agent is down all along is still told, after its 30 s.
    from whywait.simulate import make_fault

    [d] = _unseen_after_restoring(old, _run(start, 60, [make_fault("agent-down", "node-06", 0, 60)]), start)
    assert d.labels["node"] == "node-06" and "Nothing has ever come from node-06" in d.cause
    assert 30 <= d.detected_at - start <= 36, d.detected_at - start
