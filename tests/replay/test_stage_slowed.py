"""A pipeline stage that slows mid-run is told as a stage that slowed, not as how the model is partitioned.

A tester's 16-rank job (4 stages x 4 replicas, ``--layout pp=4,dp=4``) whose stage 2 got 1.5x slower at step
150 of 300 (a bad change in its layers) was told ``job.stage-imbalance``: "This is how the model is partitioned
... Rebalance the pipeline", the wrong cause and the wrong fix, though whywait had 150 steps of the stage
before.  The condition now gives the stage's ratio before it was first seen the bottleneck (``stage_before``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from whywait.engine.cli import main
from whywait.engine.replay import PlacedTopology, incidents, replay

from tests.support.tables import REPO

START = 1_764_928_800.0


def pipeline(tmp_path: Path, last: float, stage2_from: int | None) -> list[dict[str, Any]]:
    """Stages 0-2 compute 1.0 s a step and stage 3 ``last`` s; stage 2 1.5x from step ``stage2_from``.  Ranks in
    Megatron-LM's order (rank = stage * 4 + replica); the other stages wait in pipeline bubbles."""
    import json

    from whywait.engine.rules.loader import load_rules

    rng = random.Random(5)
    t, rows = START, ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,pipeline_wait_s,node"]
    for step in range(300):
        comp = {r: (last if r // 4 == 3 else 1.0) * (1.5 if r // 4 == 2 and stage2_from is not None
                                                     and step >= stage2_from else 1.0)
                * (1 + rng.uniform(-0.02, 0.02)) for r in range(16)}
        slow = max(comp.values())
        dur = slow + 0.1
        t += dur
        rows += [f"{t:.4f},pipe,{r},{step},{dur:.4f},0.01,{comp[r]:.4f},0.09,{slow - comp[r]:.4f},node-{r // 8:02d}"
                 for r in range(16)]
    (tmp_path / "steps.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "steps.jsonl"
    assert main(["import", str(tmp_path / "steps.csv"), "--project", "llm", "--team", "ml", "--layout", "pp=4,dp=4",
                 "-o", str(out)]) == 0
    msgs = [json.loads(line) for line in out.read_text().splitlines()]
    res, _ = replay(msgs, load_rules([REPO / "rules"]), PlacedTopology())
    return [{"rule": s.first.rule_id, "cause": s.told.cause, "next": s.told.next_step, "start": s.start - START}
            for s in incidents(res.diagnoses, res.end, res.open_at_end)]


def test_a_stage_that_slowed_mid_run_is_not_called_the_partitioning(tmp_path: Path) -> None:
    [told] = pipeline(tmp_path, last=1.0, stage2_from=150)
    assert told["rule"] == "job.stage-imbalance" and 150 * 1.1 < told["start"] < 150 * 1.1 + 20
    assert "It did 1.00x before: the stage itself slowed" in told["cause"], told["cause"]
    assert "how the model is partitioned" not in told["cause"] and "Rebalance" not in told["next"]


def test_a_last_stage_slower_from_the_start_is_still_the_partitioning(tmp_path: Path) -> None:
    [told] = pipeline(tmp_path, last=1.3, stage2_from=None)
    assert told["rule"] == "job.stage-imbalance" and "how the model is partitioned" in told["cause"]
    assert "Rebalance the pipeline" in told["next"]
