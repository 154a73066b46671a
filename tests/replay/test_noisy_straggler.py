"""A straggler on a noisy job stays told while it stays slow.

A tester's 32-rank table (+-10% compute jitter per rank and step, as variable sequence lengths give) with
rank 13 computing 1.3x as long from step 200 of 400: ``job.straggler`` fired, then "resolved" 45 s later
and never fired again, though the rank stayed 1.3x slow to the last step (cost told 0.05 GPU-hours of
about 0.31).  One tick on which the rank missed a test dropped its frozen past, and its slow window became
its new past.  A held rank now keeps its past while it stays half-way to the ratio that flagged it
(``step_outlier`` in engine/evaluate/step_conditions.py); one that truly recovers still resolves.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from whywait.engine.replay import incidents

from tests.support.tables import replay_table

START = 1_764_928_800.0


def table(slow_until: int, seed: int) -> list[str]:
    """A synchronous data-parallel job: every rank's step lasts as long as the slowest rank's data wait and
    compute, plus the all-reduce; the others wait for it in comm.  Rank 13 is 1.3x from step 200."""
    rng = random.Random(seed)
    t, rows = START, ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node"]
    for s in range(400):
        own = []
        for r in range(32):
            c = 0.95 * (1.3 if r == 13 and 200 <= s < slow_until else 1.0) * (1 + rng.uniform(-0.1, 0.1))
            own.append((0.03 * (1 + rng.uniform(-0.1, 0.1)), c))
        dur = max(d + c for d, c in own) + 0.2 * (1 + rng.uniform(-0.1, 0.1))
        t += dur
        rows += [f"{t:.4f},noisy,{r},{s},{dur:.4f},{d:.4f},{c:.4f},{dur - d - c:.4f},gpu-node-{r // 8:02d}"
                 for r, (d, c) in enumerate(own)]
    return rows


def stragglers(tmp_path: Path, slow_until: int, seed: int) -> list[tuple[float, float, bool, float]]:
    res, _ = replay_table(tmp_path, table(slow_until, seed))
    spans = [s for s in incidents(res.diagnoses, res.end, res.open_at_end) if s.first.rule_id == "job.straggler"]
    assert all(s.first.ranks == (13,) for s in spans), [s.first.ranks for s in spans]
    return [(s.start, s.end, s.resolved, (s.told.cost or {}).get("gpu_hours_lost", 0.0)) for s in spans]


@pytest.mark.parametrize("seed", [22, 23])
def test_a_noisy_straggler_is_told_until_the_data_ends(tmp_path: Path, seed: int) -> None:
    [(_, _, resolved, cost)] = stragglers(tmp_path, 400, seed)
    assert not resolved  # still open when the data ended, as the rank was still slow
    assert 0.2 < cost < 0.45  # about 0.31 GPU-hours: 200 steps, 0.29 s a step lost, 32 GPUs


def test_a_noisy_straggler_that_recovers_is_resolved(tmp_path: Path) -> None:
    [(_, end, resolved, _)] = stragglers(tmp_path, 300, 22)
    assert resolved and end < START + 320 * 1.38  # within a few dozen steps of its recovery at step 300


def test_a_job_held_slower_in_a_table_of_durations_only_stays_told(tmp_path: Path) -> None:
    """The same trap in ``self_history`` (the tester's s11c): one rank holds a job of step durations only ~20%
    slower from step 200 to the end of 900 steps; ``job.whole-job-slow`` was "resolved" a minute after it
    fired, and told 0.04 GPU-hours of about 1.5."""
    rng = random.Random(11)
    t, rows = START, ["time,job,rank,step,duration_s,node"]
    for s in range(900):
        worst = max(0.95 * (1.3 if r == 13 and s >= 200 else 1.0) * (1 + rng.uniform(-0.03, 0.03)) + 0.03
                    for r in range(32))
        dur = worst + 0.2 * (1 + rng.uniform(-0.03, 0.03))
        t += dur
        rows += [f"{t:.4f},dur-only,{r},{s},{dur:.4f},gpu-node-{r // 8:02d}" for r in range(32)]
    res, _ = replay_table(tmp_path, rows)
    spans = [s for s in incidents(res.diagnoses, res.end, res.open_at_end) if s.first.rule_id == "job.whole-job-slow"]
    assert len(spans) == 1 and not spans[0].resolved, [(s.start, s.end, s.resolved) for s in spans]
    assert 1.2 < (spans[0].told.cost or {})["gpu_hours_lost"] < 2.0


def test_a_comparison_keeps_half_way_to_its_threshold() -> None:
    from whywait.engine.rules.condition_types import parse_compare

    assert parse_compare("> 1.2").halfway(1.1) and not parse_compare("> 1.2").halfway(1.09)
    assert parse_compare("< 0.5").halfway(0.75) and not parse_compare("< 0.5").halfway(0.8)
    assert parse_compare("== 3").halfway(3) and not parse_compare("== 3").halfway(2)
