"""A slowdown of the whole job is told whichever part of the step grew, from a step table with its phases.

A tester's synchronous data-parallel tables (32 ranks, no node telemetry): every rank's data wait grown by
0.3 s a step, or every rank's all-reduce 2.5x as long, gave "0 incident(s)", while the same slowdown in a
table of durations only gave ``job.whole-job-slow``: the rule spoke only when compute grew or the phases were
unknown, and the rules that name an input or communication cause need node telemetry the table does not
have.  Giving whywait more data lost the finding.  Now each is told, naming the part that grew with its
figures and saying what could not be checked; one slow rank (every OTHER rank's comm wait grows) is still a
straggler, not the whole job; and a job-wide compute slowdown seen without GPU telemetry is not said to run
at normal GPU clocks (a cluster-wide thermal event is exactly what that would rule out).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.replay import PlacedTopology, replay
from whywait.engine.rules.loader import load_rules

REPO = Path(__file__).resolve().parents[2]
START = 1_764_443_800.0
RANKS, STEPS, SLOW_FROM = 16, 300, 150


def table(path: Path, part: str, seed: int = 1) -> None:
    """A synchronous job's steps as a logger writes them: the collective starts when the slowest rank is ready,
    so a rank's comm wait is the all-reduce plus its wait for the slowest; every rank's step ends together.
    From step SLOW_FROM on, ``part`` is slower: ``input`` (every rank's data wait +0.3 s), ``comm`` (the
    all-reduce 2.5x), ``compute`` (every rank 1.3x), or ``straggler`` (rank 5 computes 1.5x)."""
    rng = random.Random(seed)
    t = START
    rows = ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node"]
    for step in range(STEPS):
        slow = step >= SLOW_FROM
        own = []
        for r in range(RANKS):
            c = 0.95 * (1 + rng.uniform(-0.03, 0.03))
            c *= 1.3 if slow and part == "compute" else 1.5 if slow and part == "straggler" and r == 5 else 1.0
            d = 0.03 * (1 + rng.uniform(-0.03, 0.03)) + (0.3 if slow and part == "input" else 0.0)
            own.append((d, c))
        allreduce = 0.2 * (1 + rng.uniform(-0.03, 0.03)) * (2.5 if slow and part == "comm" else 1.0)
        dur = max(d + c for d, c in own) + allreduce
        t += dur
        for r, (d, c) in enumerate(own):
            rows.append(f"{t:.4f},phase-job,{r},{step},{dur:.4f},{d:.4f},{c:.4f},{dur - d - c:.4f},"
                        f"node-{r // 8 + 1:02d}")
    path.write_text("\n".join(rows) + "\n")


def diagnose(tmp_path: Path, part: str) -> list[Any]:
    csv, out = tmp_path / "steps.csv", tmp_path / "steps.jsonl"
    table(csv, part)
    subprocess.run([sys.executable, "-m", "whywait", "import", str(csv), "--project", "llm", "--team", "ml",
                    "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    msgs = [json.loads(line) for line in out.read_text().splitlines()]
    res, _ = replay(msgs, load_rules([REPO / "rules"]), PlacedTopology())
    return [d for d in res.diagnoses if d.status == "firing"]


@pytest.mark.parametrize("part, title, figures, points_to, unchecked", [
    ("input", "every rank waits longer for its input data, with no straggler",
     "now waits 0.33 s a step for its input data against the job's own 0.03 s before",
     ["the data loader", "the shared storage", "the dataset"], "storage latency and loader CPU could not be checked"),
    ("comm", "every rank waits longer in communication, with no straggler",
     "now waits 0.53 s a step in communication against the job's own 0.23 s before, the slowest rank too",
     ["the network fabric", "NCCL's settings", "another job's traffic on the same switches"],
     "packet loss, link state and the switches' load could not be checked"),
])
def test_a_job_wide_slowdown_in_one_part_is_told_naming_it(tmp_path: Path, part: str, title: str, figures: str,
                                                           points_to: list[str], unchecked: str) -> None:
    fired = diagnose(tmp_path, part)
    assert fired and {d.rule_id for d in fired} == {"job.whole-job-slow"}, [(d.rule_id, d.title) for d in fired]
    d = fired[0]
    assert d.culprit is None and title in d.title, d.title
    assert figures in d.cause and all(p in d.cause for p in points_to), d.cause
    # no telemetry from its nodes: said, and nothing said to be normal or seen
    assert f"no telemetry from 2 of its nodes (node-01, node-02), so {unchecked}" in d.cause, d.cause
    assert "normal" not in d.cause and " seen" not in d.cause and "shows no" not in d.cause, d.cause
    # the parts it did not tell were measured and did not grow
    assert "the job's compute did not grow" in d.clean_checks, d.clean_checks


def test_one_slow_rank_is_a_straggler_though_every_other_ranks_comm_wait_grew(tmp_path: Path) -> None:
    fired = diagnose(tmp_path, "straggler")
    rules = {d.rule_id for d in fired}
    assert "job.straggler" in rules and "job.whole-job-slow" not in rules, [(d.rule_id, d.title) for d in fired]
    [s] = [d for d in fired if d.rule_id == "job.straggler"][:1]
    assert s.ranks == (5,) and "No throttle, XID or ECC seen" not in s.next_step, s.next_step


def test_a_job_wide_compute_slowdown_without_gpu_telemetry_is_not_said_to_run_at_normal_clocks(
        tmp_path: Path) -> None:
    fired = diagnose(tmp_path, "compute")
    assert fired and {d.rule_id for d in fired} == {"job.whole-job-slow"}, [(d.rule_id, d.title) for d in fired]
    d = fired[0]
    assert "every rank computes longer, with no straggler" in d.title, d.title
    assert "every GPU runs slower alike (a cluster-wide thermal or power event)" in d.cause, d.cause
    assert "so their GPU clocks could not be checked" in d.cause and "normal" not in d.cause, d.cause
    assert "not the hardware" not in d.cause, d.cause
