"""Step tables through the real ``whywait import`` and an in-process replay with the shipped rules.

Called by the replay tests that build a table the way a training logger writes one and check what
whywait tells of it (tests/replay/test_noisy_straggler.py, test_cost_text.py, test_slow_since_start.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def import_table(tmp_path: Path, rows: list[str]) -> list[dict[str, Any]]:
    """Write ``rows`` (a CSV's lines, header first) and import them with ``--project llm --team ml`` (a placement
    too) through the CLI, as a user would; return the contract messages it wrote."""
    csv, out = tmp_path / "steps.csv", tmp_path / "steps.jsonl"
    csv.write_text("\n".join(rows) + "\n")
    subprocess.run([sys.executable, "-m", "whywait", "import", str(csv), "--project", "llm", "--team", "ml",
                    "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    return [json.loads(line) for line in out.read_text().splitlines()]


def replay_table(tmp_path: Path, rows: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    """:func:`import_table`, then replay the messages with the shipped rules and no topology; return the
    :class:`~whywait.engine.replay.ReplayResult` and the messages."""
    from whywait.engine.replay import PlacedTopology, replay
    from whywait.engine.rules.loader import load_rules

    msgs = import_table(tmp_path, rows)
    res, _ = replay(msgs, load_rules([REPO / "rules"]), PlacedTopology())
    return res, msgs


def sync_dp_rows(job: str, ranks: int, steps: int, compute: float, data: float, allreduce: float, noise: float, *,
                 compute_mult: Any = None, data_add: Any = None, step_mult: Any = None, extra_all: Any = None,
                 spike: Any = None, seed: int = 1, start: float = 1_764_928_800.0, per_node: int = 8) -> list[str]:
    """A synchronous data-parallel job's step table, as its logger writes it (header first).

    Per step each rank waits ``data`` for input and computes ``compute`` (each times 1 ± ``noise``, uniform),
    scaled by ``compute_mult(step, rank)`` and ``step_mult(step)``, plus ``data_add(step, rank)`` and a
    ``spike(step, rank, rng)`` factor; the all-reduce starts when the slowest rank is ready and takes
    ``allreduce``; ``extra_all(step)`` seconds (a checkpoint) fall in no phase.  Every rank's step ends
    together, its duration the slowest's, and the others wait in comm: a straggler shows as less comm on the
    slow rank, not as a longer step.  (After a tester's generator, pass25.)
    """
    import random

    rng = random.Random(seed)
    t = start
    rows = ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node"]
    for s in range(steps):
        own = []
        for r in range(ranks):
            c = compute * (step_mult(s) if step_mult else 1.0) * (compute_mult(s, r) if compute_mult else 1.0)
            c *= (1 + rng.uniform(-noise, noise)) * (spike(s, r, rng) if spike else 1.0)
            d = data * (1 + rng.uniform(-noise, noise)) + (data_add(s, r) if data_add else 0.0)
            own.append((d, c))
        extra = extra_all(s) if extra_all else 0.0
        dur = max(d + c for d, c in own) + allreduce * (1 + rng.uniform(-noise, noise)) + extra
        t += dur
        rows += [f"{t + rng.uniform(0, 0.002):.4f},{job},{r},{s},{dur:.4f},{d:.4f},{c:.4f},{dur - extra - d - c:.4f},"
                 f"gpu-node-{r // per_node:02d}" for r, (d, c) in enumerate(own)]
    return rows
