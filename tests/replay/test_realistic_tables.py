"""Realistic step tables with a known answer: what whywait tells of each, imported and replayed with no telemetry.

After a tester's pass (session 25) who had not written the rules: synchronous data-parallel jobs of 32 ranks,
every rank's step as long as the slowest rank's, ±3% noise, and what real jobs have that is no fault (mixed
hardware, periodic checkpoints, a rank that writes them, warm-up, heavy-tailed hiccups) must stay quiet, while
several stragglers at once and a per-step rotation are told as such.  Each case is one of the tester's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.replay import incidents

from tests.support.tables import replay_table, sync_dp_rows

_DRAW = random.Random(81)
_WHO = [_DRAW.randrange(32) for _ in range(400)]  # the rank that draws the heavy batch, per step

CASES: dict[str, tuple[dict[str, Any], set[tuple[str, tuple[int, ...]]]]] = {
    # no fault: two nodes of an older GPU, 1.15x from the start
    "mixed-hardware": ({"compute_mult": lambda s, r: 1.15 if r < 16 else 1.0, "seed": 3}, set()),
    # no fault: a checkpoint every 50 steps makes the step 5x longer on every rank (in no phase)
    "checkpoints": ({"extra_all": lambda s: 4.8 if s % 50 == 49 else 0.0, "seed": 7}, set()),
    # no fault: rank 0 writes the checkpoint (+6 s of its own work) while the others wait
    "rank-0-saves": ({"compute_mult": lambda s, r: 1 + 6.0 / 0.95 if r == 0 and s % 50 == 49 else 1.0, "seed": 15},
                     set()),
    # no fault: 1% of rank-steps hiccup 1.5-2.5x (GC pauses, host noise)
    "heavy-tail": ({"spike": lambda s, r, rng: rng.uniform(1.5, 2.5) if rng.random() < 0.01 else 1.0, "seed": 92},
                   set()),
    # no fault: 15 warm-up steps, 3x down to 1.3x longer on every rank
    "warm-up": ({"step_mult": lambda s: 3.0 - s * 0.12 if s < 15 else 1.0, "seed": 14}, set()),
    # three stragglers on three nodes from step 200, 1.2-1.3x
    "three-stragglers": ({"compute_mult": lambda s, r: {5: 1.25, 19: 1.30, 30: 1.20}.get(r, 1.0) if s >= 200 else 1.0,
                          "seed": 2}, {("job.straggler", (5, 19, 30))}),
    # from step 100, a different rank draws a 1.4x batch on every step
    "rotation": ({"compute_mult": lambda s, r: 1.4 if s >= 100 and r == _WHO[s] else 1.0, "seed": 81},
                 {("job.rotating-straggler", ())}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_realistic_table_is_told_what_it_holds(tmp_path: Path, case: str) -> None:
    kwargs, expected = CASES[case]
    res, _ = replay_table(tmp_path, sync_dp_rows(case, 32, 400, 0.95, 0.03, 0.2, 0.03, **kwargs))
    told = {(s.first.rule_id, tuple(s.told.ranks)) for s in incidents(res.diagnoses, res.end, res.open_at_end)}
    assert told == expected
