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
