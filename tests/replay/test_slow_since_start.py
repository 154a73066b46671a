"""A step table whose rank is slower on every step is told, not passed over as slower hardware.

A postmortem's step table or profiler traces hold a few dozen steps at most: "since the start" is all
there is.  Before ``job.slow-since-start`` a rank 1.5x slower than its seven peers on all 40 steps (every
other rank waiting 0.3 s a step for it in the all-reduce) gave "No incident": ``job.straggler`` leaves a
rank slow from its first step out, as possibly slower hardware.  Now it is told, at info, with the cost,
and saying it cannot tell slower hardware from a fault; the same table with no slow rank is quiet.
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


def table(path: Path, steps: int, slow_rank: int | None, seed: int = 1) -> None:
    """A synchronous 8-rank job's steps as a logger writes them: every rank ends a step together; the slow
    rank computes 1.5x as long and the others wait for it in the collective."""
    rng = random.Random(seed)
    t = START
    rows = ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node"]
    for step in range(1, steps + 1):
        comp = {r: 0.62 * (1 + rng.gauss(0, 0.02)) * (1.5 if r == slow_rank else 1.0) for r in range(8)}
        slow = max(comp.values())
        dur = slow + 0.12 + 0.015
        t += dur
        for r in range(8):
            rows.append(f"{t:.3f},trace-job,{r},{step},{dur:.4f},0.015,{comp[r]:.4f},{0.12 + slow - comp[r]:.4f},"
                        f"node-{r // 4 + 1:02d}")
    path.write_text("\n".join(rows) + "\n")


def diagnose(tmp_path: Path, steps: int, slow_rank: int | None) -> list[tuple[str, str | None, tuple[int, ...]]]:
    csv, out = tmp_path / "steps.csv", tmp_path / "steps.jsonl"
    table(csv, steps, slow_rank)
    subprocess.run([sys.executable, "-m", "whywait", "import", str(csv), "--project", "llm", "--team", "ml",
                    "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    msgs = [json.loads(line) for line in out.read_text().splitlines()]
    res, _ = replay(msgs, load_rules([REPO / "rules"]), PlacedTopology())
    return [(d.rule_id, d.culprit, tuple(d.ranks)) for d in res.diagnoses if d.status == "firing"]


@pytest.mark.parametrize("steps", [6, 40])
def test_a_rank_slower_on_every_step_of_a_table_is_told(tmp_path: Path, steps: int) -> None:
    fired = diagnose(tmp_path, steps, slow_rank=5)
    assert fired and {f[0] for f in fired} == {"job.slow-since-start"}, fired
    assert fired[0][1:] == ("node-02", (5,))


def test_the_same_table_with_no_slow_rank_is_quiet(tmp_path: Path) -> None:
    assert diagnose(tmp_path, 40, slow_rank=None) == []


def test_a_step_table_of_durations_only_is_not_said_to_have_no_straggler(tmp_path: Path) -> None:
    """A tester's table of step times only (every rank slower from step 300) was told "with no straggler among its
    16 ranks and no throttled GPU": whywait can know neither from step times alone, with no telemetry."""
    rng = random.Random(3)
    rows, t = ["time,job,rank,step,duration_s,node"], START
    for step in range(1, 401):
        d = 0.66 * (1 + rng.gauss(0, 0.02)) * (1.25 if step > 300 else 1.0)
        t += d
        rows += [f"{t:.3f},dur-job,{r},{step},{d:.4f},node-{r // 8 + 1:02d}" for r in range(16)]
    csv, out = tmp_path / "steps.csv", tmp_path / "steps.jsonl"
    csv.write_text("\n".join(rows) + "\n")
    subprocess.run([sys.executable, "-m", "whywait", "import", str(csv), "--project", "llm", "--team", "ml",
                    "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    res, _ = replay([json.loads(x) for x in out.read_text().splitlines()], load_rules([REPO / "rules"]),
                    PlacedTopology())
    [told] = [x for x in res.diagnoses if x.status == "firing" and x.rule_id == "job.whole-job-slow"][:1]
    assert "cannot show a straggler" in told.title and "no straggler" not in told.title
    assert "no telemetry from 2 of its nodes (node-01, node-02)" in told.cause and "no throttled GPU" not in told.cause


def bundle_of(tmp_path: Path, msgs: list[dict[str, Any]]) -> Path:
    """The messages as an export bundle, so ``whywait replay --input`` reads them with no broker."""
    from whywait.agents.events import topic_for_kind
    from whywait.engine.importers.bundle import BundleWriter
    from whywait.simulate.cluster import make_cluster

    topo = tmp_path / "topo.yaml"
    make_cluster(nodes=2).to_yaml(topo)
    times = [m["time"] for m in msgs]
    p = tmp_path / "table.whywait"
    with BundleWriter(p, {"since": min(times) - 1, "until": max(times) + 1, "lead_s": 0.0}) as bw:
        for m in msgs:
            bw.add(topic_for_kind(m["kind"]), json.dumps(m).encode())
        bw.close(topo, [])
    return p


def test_the_console_says_when_a_quiet_window_says_little(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The tester's 4-step traces gave "0 incident(s)" on the console and the "too little to judge" note only in the
    report; steps with no placement were read and never judged, with nothing said."""
    from whywait.engine.cli import main

    csv, out = tmp_path / "steps.csv", tmp_path / "steps.jsonl"
    table(csv, 4, slow_rank=None)
    subprocess.run([sys.executable, "-m", "whywait", "import", str(csv), "--project", "llm", "--team", "ml",
                    "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    msgs = [json.loads(x) for x in out.read_text().splitlines()]
    assert main(["replay", "--input", str(bundle_of(tmp_path, msgs)), "--rules", str(REPO / "rules")]) == 0
    said = capsys.readouterr().out
    assert "0 incident(s)" in said and "note: Too little to judge trace-job: 4 steps per rank" in said
    unplaced = [m for m in msgs if m["kind"] != "placement"]
    (tmp_path / "b").mkdir()
    assert main(["replay", "--input", str(bundle_of(tmp_path / "b", unplaced)), "--rules", str(REPO / "rules")]) == 0
    said = capsys.readouterr().out
    assert "note: steps of trace-job came with no placement naming the job, so they were not judged" in said


def test_the_reports_axis_spans_the_data_not_the_whole_window_asked_for(tmp_path: Path) -> None:
    """A tester's 7 s trace, replayed with the default 15-minute lead, was a sliver at the plot's right edge."""
    from whywait.engine.replay import Window, incidents
    from whywait.engine.report import build_report

    csv, out = tmp_path / "steps.csv", tmp_path / "steps.jsonl"
    table(csv, 40, slow_rank=5)
    subprocess.run([sys.executable, "-m", "whywait", "import", str(csv), "--project", "llm", "--team", "ml",
                    "-o", str(out)], check=True, capture_output=True, cwd=REPO)
    msgs = [json.loads(x) for x in out.read_text().splitlines()]
    w = Window(START - 3600, START + 3600, lead_s=900)
    res, _ = replay(msgs, load_rules([REPO / "rules"]), PlacedTopology())
    spans = incidents(res.diagnoses, res.end)
    grid = build_report(res, spans, msgs, w, PlacedTopology()).data.grid
    assert res.start is not None and res.end is not None and spans
    # a minute around the data and its incident (which runs on after the data, for its keep_firing_for)
    assert res.start - 61 <= grid.t0 < res.start and res.end < grid.t1 <= res.end + 120, (grid.t0, grid.t1)
