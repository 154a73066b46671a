"""The stream processor without Kafka: decode, dead-letter, skip, evaluate."""

from __future__ import annotations

import json
from pathlib import Path

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
