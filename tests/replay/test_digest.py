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
    assert lost["network"] == 1.25  # the resolved diagnosis's cost: the whole incident
    # storage and input had no cost: estimated, steps twice as slow from +1800 s to +2400 s on 16 GPUs
    # (half of 16 GPUs x 600 s), the last 300 s shared between the two: counted once, not twice
    assert lost["storage"] == pytest.approx(0.5 * 16 * (300 + 150) / 3600, rel=1e-3)
    assert lost["input pipeline"] == pytest.approx(0.5 * 16 * 150 / 3600, rel=1e-3)
    assert lost["storage"] + lost["input pipeline"] == pytest.approx(0.5 * 16 * 600 / 3600, rel=1e-3)
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
    assert "research / llm" in text and "lost to waiting" in text and "network 1.2" in text and "ads" not in text
    png = digest.plot(tmp_path / "d.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
