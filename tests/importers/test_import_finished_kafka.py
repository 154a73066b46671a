"""An imported job ends where its steps end: `whywait import --project/--team` publishes a `finished` placement
just after each job's last step, besides the `running` one before its first.

Before, only the `running` placement was published, so the job stayed placed for ever: every later replay
carried it ("placement skipped: unknown node ..." with a topology, its nodes "learnt from the placements"
without one), and the live engine placed it too.  Through the real broker: a replay of the imported window
concludes exactly what it did when the job never finished (the `finished` placement is past the window's
end), and a replay of a later window holds no trace of the job."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
START = float(int(time.time()) - 86_400 * 43)  # a stretch of past event time of its own
RANKS, STEPS, SHIFT_AT, SLOW = 8, 300, 150, 1.3


def whywait(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "whywait", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


def write_table(path: Path, job: str) -> float:
    """A synchronous job, every step ``SLOW`` times as long from step ``SHIFT_AT`` on; returns its last step's end."""
    rng = random.Random(7)
    t = START
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "rank", "step", "duration_s", "node", "job"])
        for it in range(1, STEPS + 1):
            d = 1.0 * (1 + rng.gauss(0, 0.02)) * (SLOW if it > SHIFT_AT else 1.0)
            t += d
            for r in range(RANKS):
                w.writerow([f"{t:.3f}", r, it, f"{d:.4f}", f"{job}-node-{r // 4}", job])
    return round(t, 3)


def _args(**kw: Any) -> argparse.Namespace:
    base = {"job": None, "node": None, "rank": None, "project": None, "team": None, "channel": None}
    return argparse.Namespace(**{**base, **kw})


def test_each_imported_job_gets_a_finished_placement_just_after_its_last_step(tmp_path: Path) -> None:
    from whywait.engine.commands.import_cmd import timing_messages

    f = tmp_path / "two.csv"
    f.write_text("time,job,rank,step,duration_s,node\n"
                 "1000,a,0,1,1.0,n1\n1000,b,0,1,1.0,n2\n1001,a,0,2,1.0,n1\n1005.5,b,0,2,1.0,n2\n")
    msgs = timing_messages(_args(project="p", team="t"), [(f, "steps")])
    placements = [(m["job"], m["state"], m["time"], m["ranks"]) for m in msgs if m["kind"] == "placement"]
    assert placements == [("a", "running", 999.0, [{"rank": 0, "node": "n1", "gpu": 0}]),
                          ("b", "running", 999.0, [{"rank": 0, "node": "n2", "gpu": 0}]),
                          ("a", "finished", pytest.approx(1001.001, abs=1e-9), []),
                          ("b", "finished", pytest.approx(1005.501, abs=1e-9), [])]
    times = [m["time"] for m in msgs]
    assert times == sorted(times)  # in event-time order: each job's end after its last step, before later ones
    assert [(m["job"], m["kind"], m.get("state")) for m in msgs[-3:]] == [
        ("a", "placement", "finished"), ("b", "steps", None), ("b", "placement", "finished")]
    # without --project/--team nothing is placed, so nothing is finished either
    assert all(m["kind"] == "steps" for m in timing_messages(_args(), [(f, "steps")]))


def test_finished_at_is_after_the_last_step_even_far_in_time() -> None:
    from whywait.engine.commands.import_cmd import finished_at

    for last in (0.0, 1_796_400_000.123, 99_999_999_999.0):
        assert finished_at(last) > last and finished_at(last) - last < 2e-3


@pytest.mark.integration
def test_a_replay_of_the_imported_window_is_unchanged_and_a_later_one_holds_no_trace(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    from whywait.agents.events import TOPIC_PLACEMENT, TOPIC_STEPS
    from whywait.engine.commands.import_cmd import publish
    from whywait.engine.stream.topics import ensure_topics

    ensure_topics(kafka_bootstrap)
    env = {**os.environ, "WHYWAIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    for k in ("WHYWAIT_TOPOLOGY", "SLACK_BOT_TOKEN"):
        env.pop(k, None)
    suffix = str(int(START))
    job, old = f"fin-{suffix}", f"nofin-{suffix}"
    end = write_table(tmp_path / "job.csv", job)
    r = whywait("import", str(tmp_path / "job.csv"), "--project", "llm", "--team", "ml", env=env)
    assert r.returncode == 0, r.stderr
    assert f"published {RANKS * STEPS + 2} messages" in r.stdout, r.stdout
    # The same table as the import published it before: a `running` placement only, under another job id.
    write_table(tmp_path / "old.csv", old)
    r = whywait("import", str(tmp_path / "old.csv"), "--project", "llm", "--team", "ml", "-o",
                str(tmp_path / "old.jsonl"), env=env)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (tmp_path / "old.jsonl").read_text().splitlines()]
    assert [m["state"] for m in lines if m["kind"] == "placement"] == ["running", "finished"]
    items = [(TOPIC_PLACEMENT if m["kind"] == "placement" else TOPIC_STEPS, json.dumps(m).encode())
             for m in lines if m.get("state") != "finished"]
    assert asyncio.run(publish(kafka_bootstrap, iter(items))) == RANKS * STEPS + 1

    def replay(since: float, until: float, *jobs: str) -> tuple[subprocess.CompletedProcess, list[dict[str, Any]]]:
        out = tmp_path / f"d-{since}-{until}-{len(jobs)}.jsonl"
        r = whywait("replay", "--since", str(since), "--until", str(until), "--lead", "0s", "--read-to-end",
                    *[a for j in jobs for a in ("--job", j)], "--json", str(out), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return r, [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []

    def seen(diags: list[dict[str, Any]], name: str) -> list[tuple[Any, ...]]:
        return [(d["rule_id"], d["status"], d["detected_at"], d.get("ends_at"), d["cost"].get("gpu_hours_lost"),
                 d["title"].replace(name, "JOB")) for d in diags]

    # The imported window (its first step to its last): the same incidents as when the job never finished.
    r_new, new = replay(START - 5, end, job)
    r_old, old_diags = replay(START - 5, end, old)
    assert new and {d["rule_id"] for d in new if d["status"] == "firing"} == {"job.whole-job-slow"}, r_new.stdout
    assert seen(new, job) == seen(old_diags, old)
    assert "2 node(s) learnt from the placements" in r_new.stdout, r_new.stdout
    # A window past its end reads the job as its end left it: a `finished` placement, so it is not placed there.
    r, later = replay(end + 600, end + 900, job)
    assert later == [] and f"--job {job}: no message of it in the window" in r.stdout, r.stdout
    assert f"{job}-node" not in r.stdout + r.stderr and "placement skipped" not in r.stdout, r.stdout
    # as the import left a job before: placed for ever, its nodes learnt in a window that holds nothing of it
    r, later = replay(end + 600, end + 900, old)
    assert later == [] and f"2 node(s) learnt from the placements ({old}-node-0, {old}-node-1)" in r.stdout, r.stdout
