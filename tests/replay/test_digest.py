"""The useful-GPU-time digest: GPU-hours used from steps and placement, lost by cause from the diagnoses'
cost (or estimated from step times when a rule gave none), Block Kit and a bar chart."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.agents.events import envelope
from whywait.engine.report.digest import Digest, cause_of

T0 = 1_764_442_800.0

#: what every published diagnosis also carries, and the digest does not read
_REST = {"severity": "warning", "cause": "c", "owner": None}


def placement(job: str, project: str, ranks: int, share: float = 1.0) -> dict:
    return envelope("placement", "sched", T0, job=job, project=project, team=f"team-{project}", state="running",
                    slack_channel=f"#{project}",
                    ranks=[{"rank": r, "node": f"n{r // 8}", "gpu": r % 8, "gpu_share": share} for r in range(ranks)])


def steps(job: str, t: float, ranks: int, dur: float) -> dict:
    return envelope("steps", "n0", t, job=job, steps=[{"rank": r, "step": int(t), "duration_s": dur}
                                                      for r in range(ranks)])


@pytest.fixture()
def digest() -> Digest:
    d = Digest(T0, T0 + 7200)
    d.add(placement("llm", "research", 16))
    d.add(placement("rec", "ads", 8, share=0.5))
    t = T0
    while t < T0 + 3600:  # one hour of 1-s steps, 2 s per step from +1800 s to +2400 s
        dur = 2.0 if T0 + 1800 <= t < T0 + 2400 else 1.0
        d.add(steps("llm", t + dur, 16, dur))
        t += dur
    for k in range(3600):
        d.add(steps("rec", T0 + k + 1, 8, 1.0))
    d.add_diagnosis({**_REST, "rule_id": "network.straggler-retransmits", "fingerprint": "a", "status": "firing",
                     "job": "llm", "starts_at": T0 + 1800, "detected_at": T0 + 1805, "culprit": "n1",
                     "title": "x", "cost": {"gpu_hours_lost": 0.5}})
    d.add_diagnosis({**_REST, "rule_id": "network.straggler-retransmits", "fingerprint": "a", "status": "resolved",
                     "job": "llm", "starts_at": T0 + 1800, "detected_at": T0 + 1805, "ends_at": T0 + 2400,
                     "culprit": "n1", "title": "x", "cost": {"gpu_hours_lost": 1.25}})
    d.add_diagnosis({**_REST, "rule_id": "storage.read-latency-starvation", "fingerprint": "b", "status": "resolved",
                     "job": "llm", "starts_at": T0 + 1800, "detected_at": T0 + 1810, "ends_at": T0 + 2400,
                     "culprit": "pool-a", "title": "y", "cost": None})
    d.add_diagnosis({**_REST, "rule_id": "data.cpu-bound-loader", "fingerprint": "c", "status": "resolved",
                     "job": "llm", "starts_at": T0 + 2100, "detected_at": T0 + 2110, "ends_at": T0 + 2400,
                     "culprit": "n0", "title": "z"})
    d.finish()
    return d


def test_used_and_lost_by_cause(digest: Digest) -> None:
    rows = {r["job"]: r for r in digest.rows()}
    # llm: 16 GPUs busy in steps for the whole hour; rec: 8 ranks on half a GPU each for an hour
    assert rows["llm"]["gpu_hours_used"] == pytest.approx(16.0, rel=1e-3)
    assert rows["rec"]["gpu_hours_used"] == pytest.approx(4.0, rel=1e-3)
    lost = rows["llm"]["lost_by_cause"]
    # network's rule gave 1.25 GPU-h over +1800..+2400 s; storage (the same 600 s) and input (its last 300 s) had
    # no cost: estimated, steps twice as slow on 16 GPUs.  All three are the one slowdown of llm: half of 16 GPUs
    # for 600 s is 1.33 GPU-h, counted once (was 1.25 + 1.33, the rule's figure added to the estimates'), at the
    # largest rate where they overlap (the estimates', 8 GPU-h per hour against network's 7.5), shared by rates.
    half = 0.5 * 16 * 300 / 3600  # the job's loss in each half of the 600 s
    assert sum(lost.values()) == pytest.approx(2 * half, rel=1e-3)
    assert lost["network"] == pytest.approx(half * 7.5 / 15.5 + half * 7.5 / 23.5, rel=1e-3)
    assert lost["storage"] == pytest.approx(half * 8 / 15.5 + half * 8 / 23.5, rel=1e-3)
    assert lost["input pipeline"] == pytest.approx(half * 8 / 23.5, rel=1e-3)
    own = {i["rule_id"]: i["gpu_hours_lost"] for i in rows["llm"]["top_incidents"]}
    assert own["network.straggler-retransmits"] == 1.25  # each incident's own figure stays as the rule gave it
    assert own["storage.read-latency-starvation"] == pytest.approx(2 * half, rel=1e-3)
    assert rows["rec"]["gpu_hours_lost"] == 0.0 and not rows["rec"]["lost_by_cause"]


def test_causes_map_from_rule_domains() -> None:
    assert cause_of("data.cpu-bound-loader") == "input pipeline"
    assert cause_of("checkpoint.stalled") == "checkpoints"
    assert cause_of("gpu.xid-ecc") == "GPU health"
    assert cause_of("job.compute-straggler") == "stragglers of unknown cause"
    assert cause_of("job.straggler") == "stragglers of unknown cause"
    # a new user's imported job "is slower everywhere, with no straggler": the digest called it a straggler
    assert cause_of("job.whole-job-slow") == "whole job slower, no straggler"
    assert cause_of("job.stage-imbalance") == "pipeline stage imbalance"
    assert cause_of("hardware.pcie-downgraded") == "hardware faults"  # was "stragglers of unknown cause"
    assert cause_of("something.new") == "other causes"  # a site's own rule


def test_every_shipped_rule_has_a_cause_of_its_own() -> None:
    from whywait.engine.rules.loader import load_rules

    rules = load_rules([Path(__file__).resolve().parents[2] / "rules"])
    ids = list(rules.rules)
    assert ids and all(cause_of(i) != "other causes" for i in ids), [i for i in ids if cause_of(i) == "other causes"]


def test_blocks_and_chart(digest: Digest, tmp_path: Path) -> None:
    blocks = digest.blocks("research")
    text = "\n".join(b["text"]["text"] for b in blocks)
    assert "research / llm" in text and "lost to waiting" in text and "network 0.5" in text and "ads" not in text
    assert "network.straggler-retransmits on n1: 0.54 GPU-h counted (1.25 by itself: shared with overlapping " \
           "incidents or partly outside the period)" in text
    png = digest.plot(tmp_path / "d.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_only_incidents_in_the_period_count_and_only_their_part_in_it() -> None:
    # Before: an incident that ended 11 h before the period counted whole ("used 0.00  lost 0.31"): diagnoses were
    # kept from a day before the period, whatever their end.
    d = Digest(T0, T0 + 3600)
    d.add(placement("llm", "research", 8))
    base = {**_REST, "rule_id": "network.straggler-retransmits", "status": "resolved", "job": "llm", "culprit": "n0",
            "title": "x"}
    d.add_diagnosis({**base, "fingerprint": "before", "starts_at": T0 - 40000, "detected_at": T0 - 39000,
                     "ends_at": T0 - 39000, "cost": {"gpu_hours_lost": 0.31}})
    d.add_diagnosis({**base, "fingerprint": "across", "starts_at": T0 - 1800, "detected_at": T0 + 1700,
                     "ends_at": T0 + 1800, "cost": {"gpu_hours_lost": 2.0}})
    d.finish()
    [row] = d.rows()
    assert row["gpu_hours_lost"] == pytest.approx(1.0)  # half of "across" lies in the period; none of "before"
    assert [(i["gpu_hours_lost"], i["gpu_hours_counted"]) for i in row["top_incidents"]] == [(2.0, 1.0)]
