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


def test_steps_of_a_job_no_placement_names_are_said_once_after_the_grace(caplog: Any) -> None:
    # A training script whose Reporter(job=...) is not the id its scheduler hook publishes: the engine
    # keeps its steps for nothing; its log is where the operator looks.
    import logging

    p = proc()
    reasons(p, Record(TOPIC_PLACEMENT, placement("alice")))

    def run(t: float) -> bytes:
        return encode(envelope("steps", "node-01", t, job="llama-run7",
                               steps=[{"rank": 0, "step": int(t - T), "duration_s": 1.0}]))

    with caplog.at_level(logging.WARNING, logger="whywait.engine.stream.processor"):
        for dt in (1, 30, 60):
            reasons(p, Record(TOPIC_STEPS, run(T + dt)))
        assert not [r for r in caplog.records if "no placement names" in r.getMessage()]
        for dt in (62, 63, 200):
            reasons(p, Record(TOPIC_STEPS, run(T + dt)))
    [line] = [r.getMessage() for r in caplog.records if "no placement names" in r.getMessage()]
    assert line.startswith("steps of job llama-run7 (from node-01) have come for 61 s, but no placement names that "
                           "job, so no rule judges it") and "placed now: j;" in line and "slurm-$SLURM_JOB_ID" in line
    assert p.counts["steps_unplaced_jobs"] == 1
    # a placed job's steps are never said
    reasons(p, Record(TOPIC_STEPS, steps("node-01", 0)), Record(TOPIC_STEPS, steps("node-01", 0)))
    assert p.counts["steps_unplaced_jobs"] == 1


def test_the_periodic_log_line_reads_as_a_sentence() -> None:
    p = proc()
    assert p.summary() == ("0 message(s) evaluated; event time not started; 0 job(s) placed; 0 incident(s) firing")
    reasons(p, Record(TOPIC_PLACEMENT, placement("alice")), Record(TOPIC_STEPS, steps("node-01", 0)),
            Record(TOPIC_STEPS, b"{not json"))
    before = p.stats()
    reasons(p, Record(TOPIC_STEPS, steps("node-01", 0)))
    line = p.summary(before)
    assert line.startswith("3 message(s) evaluated (+1); event time ") and "; 1 job(s) placed; 0 incident(s) firing; " \
        "1 dead-lettered (contract 1)" in line, line
