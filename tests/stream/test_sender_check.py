"""The processor checks who sent a job's timings against its placement, and only where it can."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from whywait.agents.events import TOPIC_HOST, TOPIC_PLACEMENT, TOPIC_STEPS, encode, envelope
from whywait.engine.evaluate.evaluator import Evaluator
from whywait.engine.rules.loader import load_rules
from whywait.engine.stream.processor import Processor, Record, _unix_user
from whywait.simulate.cluster import make_cluster

RULES = Path(__file__).resolve().parents[2] / "rules"
T = 1_700_000_000.0


def proc() -> Processor:
    return Processor(Evaluator(load_rules([RULES]), make_cluster(nodes=2, gpus_per_node=1)))


def placement(user: str) -> bytes:
    return encode(envelope("placement", "slurm", T, job="j", project="p", team="t", state="running", user=user,
                           ranks=[{"rank": 0, "node": "node-01", "gpu": 0}, {"rank": 1, "node": "node-02", "gpu": 0}]))


def steps(node: str, rank: int, **sender: Any) -> bytes:
    return encode(envelope("steps", node, T + 1, job="j", steps=[{"rank": rank, "step": 1, "duration_s": 1.0}],
                           **sender))


def reasons(p: Processor, *recs: Record) -> list[str]:
    return [json.loads(v)["reason"] for _, v in p.process(list(recs)).dead_letters]


def test_unix_user_forms() -> None:
    assert _unix_user("alice") == ("alice", None) and _unix_user("alice(1000)") == ("alice", 1000)
    assert _unix_user("system:serviceaccount:ml:trainer") is None and _unix_user(None) is None


def test_sender_is_checked_by_uid_when_both_sides_know_it() -> None:
    p = proc()
    assert reasons(p, Record(TOPIC_PLACEMENT, placement("alice(1000)")),
                   Record(TOPIC_STEPS, steps("node-01", 0, sender_uid=1000)),
                   Record(TOPIC_STEPS, steps("node-01", 0, sender_uid=0, sender_user="root"))) == []
    [why] = reasons(p, Record(TOPIC_STEPS, steps("node-01", 0, sender_uid=1001, sender_user="mallory")))
    assert why == "job j: timings sent by user 'mallory', but its placement runs it as 'alice(1000)'"


def test_sender_is_checked_by_name_and_never_for_service_accounts() -> None:
    p = proc()
    reasons(p, Record(TOPIC_PLACEMENT, placement("alice")))
    assert reasons(p, Record(TOPIC_STEPS, steps("node-01", 0, sender_uid=1000))) == []  # no name here: unknown
    assert len(reasons(p, Record(TOPIC_STEPS, steps("node-01", 0, sender_user="bob")))) == 1
    reasons(p, Record(TOPIC_PLACEMENT, placement("system:serviceaccount:ml:trainer")))
    assert reasons(p, Record(TOPIC_STEPS, steps("node-01", 0, sender_user="bob"))) == []


def test_a_rank_reported_from_another_node_is_refused() -> None:
    p = proc()
    reasons(p, Record(TOPIC_PLACEMENT, placement("alice")))
    [why] = reasons(p, Record(TOPIC_STEPS, steps("node-02", 0)))
    assert why == "job j: rank 0 runs on node-01, but node-02 reported its timings"


def test_clock_skew_is_announced_only_for_topology_nodes() -> None:
    p = proc()
    now = time.time()
    far = [Record(TOPIC_HOST, encode(envelope("host", n, now + 86_400, cpu_busy_pct=1.0, cpu_iowait_pct=0.0,
                                               mem_used_bytes=1, mem_total_bytes=2))) for n in ("node-01", "evil")]
    out = p.process(far)
    assert [json.loads(v)["category"] for _, v in out.dead_letters] == ["too_far_ahead", "unknown_node"]
    assert [(d.rule_id, d.culprit) for d in out.diagnoses] == [("whywait.agent-clock-skew", "node-01")]
