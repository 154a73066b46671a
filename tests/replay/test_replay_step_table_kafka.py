"""Through the real broker: the postmortem of jobs known only from a step table (durations, no phases, no
topology).  `whywait import` publishes the table; `whywait replay` with no topology learns the nodes from the
placements, tells the job that slowed everywhere (and when), costs it as the table says, and stays quiet on
the job whose steps only hiccup.  Before, replay refused to start without a topology, no rule could speak of a
job without phases, and the minutes after the table's last row were charged as a hang."""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START = float(int(time.time()) - 86_400 * 41)  # its own stretch of past event time
RANKS, PER_NODE, STEPS, SHIFT_AT, SLOW = 16, 8, 400, 250, 1.25


def whywait(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "whywait", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


def write_table(path: Path, job: str, slow: bool, seed: int) -> dict[str, float]:
    """A synchronous job's step table as a training loop's logger writes it: every rank ends each step
    together, 1 s steps with 2% noise and the odd GC pause (+30-80%, 3% of steps); with ``slow``, every
    step from ``SHIFT_AT`` on takes ``SLOW`` times as long.  Returns the truth: when the shift happened and
    the GPU-hours the slowdown cost (extra seconds per step × ranks)."""
    rng = random.Random(seed)
    t, shift_t, lost = START, 0.0, 0.0
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Timestamp", "Global Rank", "Iteration", "Step Time (ms)", "Hostname", "job"])
        for it in range(1, STEPS + 1):
            d = 1.0 * (1 + rng.gauss(0, 0.02)) * (1 + rng.uniform(0.3, 0.8) if rng.random() < 0.03 else 1)
            if slow and it > SHIFT_AT:
                lost += d * (SLOW - 1) * RANKS  # the part of the step the slowdown added, on every GPU
                d *= SLOW
            elif slow and it == SHIFT_AT:
                shift_t = t + d
            t += d
            for r in range(RANKS):
                w.writerow([f"{t:.3f}", r, it, f"{d * 1000:.1f}", f"{job}-node-{r // PER_NODE}", job])
    return {"shift": shift_t, "gpu_hours": lost / 3600, "end": t}


@pytest.fixture(scope="module")
def imported(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from whywait.engine.stream.topics import ensure_topics

    ensure_topics(kafka_bootstrap)
    work = tmp_path_factory.mktemp("steptable")
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    for k in ("WHYWAIT_TOPOLOGY", "SLACK_BOT_TOKEN"):
        env.pop(k, None)
    suffix = str(int(START))
    slow_job, calm_job = f"tbl-slow-{suffix}", f"tbl-calm-{suffix}"
    truth = write_table(work / "slow.csv", slow_job, True, 1)
    calm = write_table(work / "calm.csv", calm_job, False, 2)
    for f in ("slow.csv", "calm.csv"):
        r = whywait("import", str(work / f), "--project", "llm", "--team", "ml", env=env)
        assert r.returncode == 0, r.stderr
    return {"env": env, "work": work, "slow": slow_job, "calm": calm_job, "truth": truth,
            "until": max(truth["end"], calm["end"]) + 30}


def test_a_step_table_alone_is_replayed_and_its_slowdown_told(imported: dict[str, Any]) -> None:
    truth = imported["truth"]
    out = imported["work"] / "d.jsonl"
    r = whywait("replay", "--since", str(START - 5), "--until", str(imported["until"]), "--lead", "0s",
                "--read-to-end", "--job", imported["slow"], "--job", imported["calm"], "--json", str(out),
                env=imported["env"])
    assert r.returncode == 0, r.stderr
    assert "1 incident(s)" in r.stdout, r.stdout
    assert "no topology given: 4 node(s) learnt from the placements" in r.stdout, r.stdout
    import json

    diags = [json.loads(line) for line in out.read_text().splitlines()]
    firing = [d for d in diags if d["status"] == "firing"]
    assert {d["rule_id"] for d in firing} == {"job.whole-job-slow"}
    assert {d["job"] for d in firing} == {imported["slow"]}  # the job that only hiccups is quiet
    first, last = firing[0], diags[-1]
    assert "reports step durations only" in first["cause"]
    # found within 15 steps of the shift
    assert truth["shift"] <= first["detected_at"] <= truth["shift"] + 15 * SLOW, (first["detected_at"], truth)
    # the cost is the table's own: within 20% of what the slowdown added, no hang charged after its last row
    # and it ends with the table (plus the rule's keep_firing_for, 30 s), not two minutes after its last row
    assert last["status"] == "resolved" and last["ends_at"] <= truth["end"] + 31, (last["ends_at"], truth["end"])
    cost = last["cost"]["gpu_hours_lost"]
    assert cost == pytest.approx(truth["gpu_hours"], rel=0.2), (cost, truth["gpu_hours"])


def test_the_digest_counts_an_imported_jobs_loss_once_replay_publishes_it(imported: dict[str, Any]) -> None:
    """The digest reads the diagnoses topic, which only the live engine wrote: an imported job lost nothing there."""
    import json

    env, truth = imported["env"], imported["truth"]
    period = ["--since", str(START - 60), "--until", str(imported["until"] + 60)]
    out = imported["work"] / "digest.json"
    for _ in range(2):  # published twice (a replay run again): still one incident to the digest
        r = whywait("replay", "--since", str(START - 5), "--until", str(imported["until"]), "--lead", "0s",
                    "--read-to-end", "--job", imported["slow"], "--publish-diagnoses", env=env)
        assert r.returncode == 0 and "to the diagnoses topic" in r.stdout, r.stdout + r.stderr
    r = whywait("digest", *period, "--json", str(out), env=env)
    assert r.returncode == 0, r.stderr
    rows = {row["job"]: row for row in json.loads(out.read_text())}
    assert rows[imported["slow"]]["gpu_hours_lost"] == pytest.approx(truth["gpu_hours"], rel=0.2)
    assert rows[imported["calm"]]["gpu_hours_lost"] == 0
