"""`whywait import` as an ML engineer met it with real HTA traces and a logger's tables: the phase columns a
training logger writes (``data_time_ms``, ``fwd_bwd_time_ms``, ``allreduce_time_ms``) were left out as "no step
timing" and the straggler missed; a trace cut short gave its part-timed steps zero phases; ranks whose profiler
captured fewer steps were called stuck; and a few error lines said the wrong thing first."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.importers.kineto import steps_from_trace
from whywait.engine.importers.steps_table import read_steps
from whywait.engine.replay import PlacedTopology, replay
from whywait.engine.rules.loader import load_rules

REPO = Path(__file__).resolve().parents[2]
START = 1_764_443_800.0


def _import(tmp_path: Path, *argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "whywait", "import", *map(str, argv), "--project", "llm",
                           "--team", "ml", "-o", str(tmp_path / "out.jsonl")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def _messages(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]


def _fired(msgs: list[dict[str, Any]]) -> list[tuple[str, str | None, tuple[int, ...]]]:
    res, _ = replay(msgs, load_rules([REPO / "rules"]), PlacedTopology())
    return [(d.rule_id, d.culprit, tuple(d.ranks)) for d in res.diagnoses if d.status == "firing"]


# ---- 1. the phase columns training loggers write -----------------------------------------------------------------

def _logger_table(path: Path, header: list[str], steps: int = 40, slow_rank: int = 5) -> Path:
    """A synchronous 8-rank job as a training logger writes it, in ms: rank ``slow_rank`` computes 1.5x as long
    and the others wait for it in the all-reduce; every rank's iteration time is the same."""
    rng = random.Random(3)
    t, rows = START, [",".join(header)]
    for step in range(1000, 1000 + steps):
        comp = {r: 0.62 * (1 + rng.gauss(0, 0.02)) * (1.5 if r == slow_rank else 1.0) for r in range(8)}
        dur = max(comp.values()) + 0.135
        t += dur
        for r in range(8):
            rows.append(f"{t:.3f},{step},{r},gpu-node-{r // 4 + 1:02d},{dur * 1e3:.2f},15.00,{comp[r] * 1e3:.2f},"
                        f"{(dur - 0.015 - comp[r]) * 1e3:.2f},{2.5 - step * 1e-4:.4f}")
    path.write_text("\n".join(rows) + "\n")
    return path


LOGGER = ["timestamp", "iteration", "global_rank", "hostname", "iter_time_ms", "data_time_ms", "fwd_bwd_time_ms",
          "allreduce_time_ms", "loss"]


def test_a_loggers_phase_columns_are_read_and_its_straggler_found(tmp_path: Path) -> None:
    f = _logger_table(tmp_path / "train_log.csv", LOGGER)
    notes: Counter[str] = Counter()
    first = next(iter(read_steps(f, job="j", notes=notes)))[2]
    assert set(first) == {"ended_at", "rank", "step", "duration_s", "data_wait_s", "compute_s", "comm_s"}
    assert first["data_wait_s"] == pytest.approx(0.015) and first["compute_s"] > 0.5
    assert list(notes) == ["train_log.csv: column(s) loss hold no step timing: left out"]
    r = _import(tmp_path, f, "--job", "j")
    assert r.returncode == 0, r.stderr
    assert "fwd_bwd" not in r.stdout
    assert _fired(_messages(tmp_path)) == [("job.slow-since-start", "gpu-node-02", (5,))]


@pytest.mark.parametrize("header, fields", [
    ("data_time,fwd_bwd_time,step_time", ("data_wait_s", "compute_s", "duration_s")),
    ("dataloader_time_s,compute_time_s,comm_time_s,batch_time_s", ("data_wait_s", "compute_s", "comm_s",
                                                                    "duration_s")),
    ("data_load_time_ms,forward_backward_ms,communication_time_ms,iter_time_ms",
     ("data_wait_s", "compute_s", "comm_s", "duration_s")),
    ("Data Time (ms),Compute Time (ms),Sync Time (ms),Step Time (ms)", ("data_wait_s", "compute_s", "comm_s",
                                                                       "duration_s")),
])
def test_the_usual_names_of_the_phases_in_any_unit(tmp_path: Path, header: str, fields: tuple[str, ...]) -> None:
    scale = 1e3 if "ms" in header else 1.0
    f = tmp_path / "t.csv"
    values = [0.02, 0.5, 0.1, 0.7][:len(fields)] if len(fields) == 4 else [0.02, 0.5, 0.7]
    f.write_text(f"time,rank,step,{header}\n{START},0,1," + ",".join(f"{v * scale:g}" for v in values) + "\n")
    notes: Counter[str] = Counter()
    rec = next(iter(read_steps(f, job="j", node="n", notes=notes)))[2]
    assert {k: rec[k] for k in fields} == pytest.approx(dict(zip(fields, values, strict=True)))
    assert not notes


def test_a_column_that_times_part_of_a_phase_is_still_left_out(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text(f"time,rank,step,duration_s,forward_time,backward_time\n{START},0,1,0.7,0.2,0.3\n")
    notes: Counter[str] = Counter()
    rec = next(iter(read_steps(f, job="j", node="n", notes=notes)))[2]
    assert "compute_s" not in rec
    assert list(notes) == ["t.csv: column(s) backward_time, forward_time hold no step timing: left out"]


# ---- real traces, tiled into longer captures -----------------------------------------------------------------------

HTA = REPO / "tests" / "fixtures" / "importers" / "hta"


def _tiled(rank: int, steps: int, base: int = 0) -> dict[str, Any]:
    """HTA's real two-step trace of rank ``base`` repeated to ``steps`` steps (ProfilerStep#551 on), as ``rank``:
    each copy shifted by the two steps' span, its step numbers and correlation ids moved past the last."""
    d = json.load(gzip.open(HTA / f"sampled_rank-{base}.json.gz"))
    events = d["traceEvents"]
    spans = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    t0 = min(e["ts"] for e in spans)
    span = max(e["ts"] + e["dur"] for e in spans) - t0 + 50
    timed = [e for e in events if e.get("ph") == "X" and float(e["ts"]) >= t0]
    out = [e for e in events if e not in timed]
    for k in range(steps // 2):
        for e in timed:
            e2 = json.loads(json.dumps(e))
            e2["ts"] = float(e["ts"]) + k * span
            args = e2.get("args") or {}
            for key in ("correlation", "External id"):
                if isinstance(args.get(key), int):
                    args[key] += k * 10_000_000
            if e2["name"].startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(e2['name'].split('#')[1]) + 2 * k}"
            out.append(e2)
    d["traceEvents"] = out
    d["distributedInfo"] = dict(d["distributedInfo"], rank=rank, world_size=8)
    return d


def _write(path: Path, trace: dict[str, Any]) -> Path:
    with gzip.open(path, "wt") as fh:
        json.dump(trace, fh)
    return path


# ---- 3. ranks whose profiler captured fewer steps ------------------------------------------------------------------

def test_ranks_with_a_shorter_capture_are_aligned_not_called_stuck(tmp_path: Path) -> None:
    files = [_write(tmp_path / f"rank-{r}.pt.trace.json.gz", _tiled(r, 10 if r < 6 else 2)) for r in range(8)]
    r = _import(tmp_path, *files, "--job", "j", "--node", "n")
    assert r.returncode == 0, r.stderr
    assert ("note: job j: the ranks' profiler traces cover different steps: kept steps 551-552, which every rank's "
            "trace holds, and left out ranks 0-5: steps 553-560") in r.stdout
    msgs = _messages(tmp_path)
    steps = Counter((m["steps"][0]["rank"], m["steps"][0]["step"]) for m in msgs if m["kind"] == "steps")
    assert sorted(steps) == [(rank, s) for rank in range(8) for s in (551, 552)]
    assert not [f for f in _fired(msgs) if f[0] == "job.rank-silent"]


def test_traces_that_share_no_step_are_refused(tmp_path: Path) -> None:
    early = _tiled(0, 2)
    late = _tiled(1, 4)
    late["traceEvents"] = [e for e in late["traceEvents"] if e.get("name") not in ("ProfilerStep#551",
                                                                                   "ProfilerStep#552")]
    r = _import(tmp_path, _write(tmp_path / "rank-0.json.gz", early), _write(tmp_path / "rank-1.json.gz", late),
                "--job", "j", "--node", "n")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "whywait import: job j: the profiler traces share no step (rank 0: steps 551-552; rank 1: steps "
        "553-554): import traces of one profiling window")


def test_a_table_whose_rank_misses_rows_is_not_cut(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("time,rank,step,duration_s\n" + "".join(
        f"{START + s},{r},{s},0.7\n" for s in range(1, 11) for r in range(4) if not (r == 3 and s > 2)))
    r = _import(tmp_path, f, "--job", "j", "--node", "n")
    assert r.returncode == 0 and "cover different steps" not in r.stdout
    assert len([m for m in _messages(tmp_path) if m["kind"] == "steps"]) == 32


# ---- 2. a trace cut short ------------------------------------------------------------------------------------------

def test_a_cut_traces_steps_keep_their_duration_and_no_made_up_phases(tmp_path: Path) -> None:
    """HTA's real rank-0 trace cut where its step 551 had lost half its kernels (its host events all read): the
    step read 0.055 s of compute for 0.106, and a cut further on read zero: its phases are now left out."""
    text = gzip.open(HTA / "sampled_rank-0.json.gz", "rt").read()
    cut = tmp_path / "rank-0.json"
    cut.write_text(text[:1_300_000])
    notes: Counter[str] = Counter()
    steps = steps_from_trace(cut, notes=notes)
    assert [(s.step, s.compute_s, s.comm_s, s.data_wait_s) for s in steps] == [(551, None, None, None),
                                                                            (552, None, None, None)]
    assert [s.record()["duration_s"] for s in steps] == [0.607312, 0.622928]
    assert ("rank-0.json: the trace is cut short, so any of its steps may have lost events after the cut: the 2 "
            "steps read (ProfilerStep#551-552) keep their duration and leave out their phases (unknown, not zero)"
            ) in notes
    whole = steps_from_trace(HTA / "sampled_rank-0.json.gz")
    assert whole[0].compute_s == pytest.approx(0.106252)


def test_a_cut_rank_leaves_its_phases_out_and_the_other_ranks_are_whole(tmp_path: Path) -> None:
    """Eight ranks of a real trace, rank 3's gzip cut at three fifths: its steps read zero or part compute (the rank
    looked the fastest, and a straggler there was lost); now they have no phases, the others keep theirs."""
    files = [_write(tmp_path / f"rank-{r}.pt.trace.json.gz", _tiled(r, 6)) for r in range(8)]
    raw = files[3].read_bytes()
    files[3].write_bytes(raw[:len(raw) * 3 // 5])
    r = _import(tmp_path, *files, "--job", "j", "--node", "n")
    assert r.returncode == 0, r.stderr
    assert "rank-3.pt.trace.json.gz: the trace is cut short, so any of its steps" in r.stdout
    steps = [m["steps"][0] for m in _messages(tmp_path) if m["kind"] == "steps"]
    assert {s["rank"] for s in steps} == set(range(8))
    assert all(("compute_s" in s) == (s["rank"] != 3) for s in steps)
