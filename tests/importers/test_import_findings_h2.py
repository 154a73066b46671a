"""`whywait import` as a new user writing a postmortem met it (helper h2's findings #10, #17, #18, #21).

- #10 an explicit ``--rank`` wins over the trace's ``distributedInfo.rank`` (the docs said the opposite), with a
  note when they disagree; a trace without ``--node`` asks for ``--node`` only, not for a job that was given;
- #17 step times that go backwards, and times in the far future, are said (they went through silently);
- #18 two rows of one step whose times differ by a second no longer print both as ``1.7964e+09``;
- #21 a bad line of an edited bundle is said once (it was a WARNING log line and the summary's line), and a
  line naming an unknown topic says so.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from whywait.engine.importers.kineto import steps_from_trace

REPO = Path(__file__).resolve().parents[2]
T0 = 1_764_442_800_000_000.0  # µs since 1970


def imp(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "whywait", "import", *args, "-o", str(tmp_path / "out.jsonl")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def ranks_said(notes: Counter[str]) -> list[str]:
    return [n for n in notes if "--rank" in n]


def trace(path: Path, **top: object) -> Path:
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": T0, "dur": 1000}]
    path.write_text(json.dumps({**top, "traceEvents": ev}))
    return path


# ---- #10 rank precedence, and what a trace import asks for ----------------------------------------------------

def test_an_explicit_rank_wins_over_the_traces_own_with_a_note(tmp_path: Path) -> None:
    f = trace(tmp_path / "t.json", distributedInfo={"rank": 1})
    notes: Counter[str] = Counter()
    assert {s.rank for s in steps_from_trace(f, 5, notes)} == {5}
    assert ranks_said(notes) == ["t.json: --rank 5 used, though distributedInfo.rank says rank 1"]
    # a file name's rank is the trace's word too when it has no distributedInfo
    g = trace(tmp_path / "rank-3.json")
    notes.clear()
    assert {s.rank for s in steps_from_trace(g, 4, notes)} == {4}
    assert ranks_said(notes) == ["rank-3.json: --rank 4 used, though its file name says rank 3"]
    # agreeing, or nothing to disagree with: no note
    notes.clear()
    assert {s.rank for s in steps_from_trace(f, 1, notes)} == {1}
    assert {s.rank for s in steps_from_trace(trace(tmp_path / "x.json"), 2, notes)} == {2}
    assert not ranks_said(notes)
    # without --rank, the trace's own rank (before its file name's)
    h = trace(tmp_path / "rank-9.json", distributedInfo={"rank": 2})
    assert {s.rank for s in steps_from_trace(h)} == {2}


def test_the_cli_says_the_rank_note(tmp_path: Path) -> None:
    f = trace(tmp_path / "t.json", distributedInfo={"rank": 1})
    r = imp(tmp_path, str(f), "--job", "j", "--node", "a", "--rank", "5")
    assert r.returncode == 0, r.stderr
    assert "  note: t.json: --rank 5 used, though distributedInfo.rank says rank 1" in r.stdout.splitlines()
    rec = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert rec["steps"][0]["rank"] == 5


@pytest.mark.parametrize("given, says", [
    (["--job", "x"], "a profiler trace does not name its node: pass --node"),
    (["--node", "n"], "a profiler trace does not name its job: pass --job"),
    ([], "a profiler trace does not name its job or its node: pass --job and --node"),
])
def test_a_trace_import_asks_only_for_what_is_missing(tmp_path: Path, given: list[str], says: str) -> None:
    f = tmp_path / "trace.json.gz"
    f.write_bytes(gzip.compress(trace(tmp_path / "t.json", distributedInfo={"rank": 0}).read_bytes()))
    r = imp(tmp_path, str(f), *given)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"whywait import: {f}: {says}"]
