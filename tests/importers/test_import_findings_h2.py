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
import re
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


# ---- #17 time going backwards, and times from the future ----------------------------------------------------

def _table(path: Path, rows: list[str], header: str = "time,job,rank,step,duration_s,node") -> Path:
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return path


def test_steps_whose_time_goes_backwards_are_said_once_naming_the_first_row(tmp_path: Path) -> None:
    # two ranks; steps 3 and 4 of each stamped 500 s before step 0 (as csv/back.csv of the findings)
    rows = [f"{1796400000 + s - (500 if s in (3, 4) else 0)},j,{r},{s},1,n" for s in range(6) for r in range(2)]
    f = _table(tmp_path / "back.csv", rows)
    r = imp(tmp_path, str(f))
    assert r.returncode == 0, r.stderr
    notes = [x for x in r.stdout.splitlines() if "note:" in x]
    assert notes == [f"  note: {f}:8: time goes backwards: job j rank 0 step 3 ends at 2026-12-04T15:51:43Z, "
                     f"499.000 s before its step 2 ({f}:6) does; a clock that stepped back? (2 rows like it)"]
    assert "wrote 12 messages" in r.stdout  # a note, not an error: the steps are imported as they are
    # steps in order, or rows of one rank out of order in the file but not in time: nothing said
    ok = _table(tmp_path / "ok.csv", ["1796400002,j,0,2,1,n", "1796400001,j,0,1,1,n", "1796400001,j,1,1,1,n"])
    assert "note" not in imp(tmp_path, str(ok)).stdout


def test_a_time_from_the_future_is_noted_and_the_year_5138_refused(tmp_path: Path) -> None:
    from whywait.engine.commands.import_cmd import check_times

    now = 1_796_400_000.0
    rows = [("j", "n", {"rank": 0, "step": s, "ended_at": now + d}) for s, d in ((0, 60.0), (1, 3 * 86_400.0),
                                                                                    (2, 3 * 86_400.0 + 1))]
    where = {id(rec): f"t.csv:{i + 2}" for i, (_, _, rec) in enumerate(rows)}
    notes: Counter[str] = Counter()
    check_times(rows, where, notes, now=now)
    assert list(notes) == ["t.csv:3: time 2026-12-07T16:00:00Z is 3.0 days after now (2026-12-04T16:00:00Z): a "
                           "clock set wrong? (2 rows like it)"]
    notes.clear()
    check_times(rows[:1], where, notes, now=now)  # a minute ahead (a clock a little off): nothing said
    assert not notes
    # through the CLI, against the wall clock: a table a few days ahead imports with the note
    import time

    soon = _table(tmp_path / "soon.csv", [f"{time.time() + 5 * 86_400:.3f},j,0,1,1,n"])
    r = imp(tmp_path, str(soon))
    assert r.returncode == 0 and f"  note: {soon}:2: time " in r.stdout and "days after now" in r.stdout, r.stdout
    # the year 5138 is no time a step ended: refused, naming the row
    far = _table(tmp_path / "future.csv", ["1796400000,j,0,0,1,n", "99999999999,j,0,1,1,n"])
    r = imp(tmp_path, str(far))
    assert r.returncode == 2
    assert re.fullmatch(re.escape(f"whywait import: {far}:3: time 99999999999 s since 1970 is 5138-11-16T09:46:39Z, ")
                        + r"3,1\d\d years from now: no step has ended then: surely a unit mistake "
                        r"\(or a placeholder\); fix the time", r.stderr.strip()), r.stderr


# ---- #18 the duplicate-row error's times ----------------------------------------------------------------------

def test_two_rows_of_one_step_print_their_values_in_full(tmp_path: Path) -> None:
    f = _table(tmp_path / "dupstep.csv", ["1796400000,j,0,0,1,n", "1796400001,j,0,0,1,n"])
    r = imp(tmp_path, str(f))
    assert r.returncode == 2
    assert r.stderr.strip() == (f"whywait import: {f}:3: job j rank 0 step 0 is also on line 2, with other values "
                                "(time 2026-12-04T16:00:00Z there, 2026-12-04T16:00:01Z here): one row per rank per "
                                "step")
    g = _table(tmp_path / "d2.csv", ["1796400000.25,j,0,0,0.8,n", "1796400000.25,j,0,0,0.8000001,n"])
    assert "(duration_s 0.8 there, 0.8000001 here)" in imp(tmp_path, str(g)).stderr


# ---- #21 an edited bundle's bad lines: said once, an unknown topic as that ------------------------------------

def test_an_edited_bundles_bad_lines_are_said_once_and_an_unknown_topic_as_that(tmp_path: Path) -> None:
    import zipfile

    from whywait.engine.importers.bundle import Bundle, BundleWriter

    host = {"schema": 1, "kind": "host", "time": T0 / 1e6 + 1, "node": "node-01", "cpu_busy_pct": 5.0,
            "cpu_iowait_pct": 0.0, "mem_used_bytes": 1, "mem_total_bytes": 2}
    good = json.dumps({"topic": "whywait.host.v1", "value": json.dumps(host)})
    p = tmp_path / "edited.whywait"
    with BundleWriter(p, {"since": T0 / 1e6, "until": T0 / 1e6 + 60, "lead_s": 0.0}) as bw:
        bw.add("whywait.host.v1", json.dumps(host).encode())
        bw.close(None, [])
    # edited as the findings did, and its checksums recomputed (a bundle's reader can only take it at its word)
    lines = [good, "not json at all", '{"topic":"whywait.nosuch.v1","value":{"a":1}}',
             '{"topic":"whywait.nosuch.v1"}', '{"topic":"whywait.host.v1","value":{"a":1}}', good]
    events = ("\n".join(lines) + "\n").encode()
    import hashlib

    with zipfile.ZipFile(p) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    manifest["members"]["events.jsonl"] = {"sha256": hashlib.sha256(events).hexdigest(), "bytes": len(events)}
    members.update({"events.jsonl": events, "manifest.json": json.dumps(manifest).encode()})
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    b = Bundle(p)
    b.verify()
    assert len(list(b.events())) == 2
    assert b.skipped == {'events.jsonl: line 2: expected {"topic": ..., "value": "..."}': 1,
                         "events.jsonl: line 3: unknown topic 'whywait.nosuch.v1'": 1,
                         "events.jsonl: line 4: unknown topic 'whywait.nosuch.v1'": 1,
                         'events.jsonl: more lines: expected {"topic": ..., "value": "..."}': 1}
    r = imp(tmp_path, str(p))
    assert r.returncode == 0, r.stderr
    assert "WARNING" not in r.stderr and "events.jsonl" not in r.stderr, r.stderr  # said once: in the summary
    said = [x for x in r.stdout.splitlines() if "events.jsonl" in x]
    assert said == ['  skipped 1: events.jsonl: line 2: expected {"topic": ..., "value": "..."}',
                    "  skipped 1: events.jsonl: line 3: unknown topic 'whywait.nosuch.v1'",
                    "  skipped 1: events.jsonl: line 4: unknown topic 'whywait.nosuch.v1'",
                    '  skipped 1: events.jsonl: more lines: expected {"topic": ..., "value": "..."}']


def test_a_duplicate_rows_values_hide_a_units_conversion_noise(tmp_path: Path) -> None:
    """A table in ms: 497.87 ms read 0.49787000000000003 s in the error; two values that differ only past 12
    digits are still told apart."""
    f = _table(tmp_path / "ms.csv", ["1796400000,j,0,0,497.87,n", "1796400000,j,0,0,497.88,n"],
               header="time,job,rank,step,duration_ms,node")
    assert "(duration_s 0.49787 there, 0.49788 here)" in imp(tmp_path, str(f)).stderr
    g = _table(tmp_path / "close.csv", ["1796400000,j,0,0,0.8,n", "1796400000,j,0,0,0.8000000000001,n"])
    assert "(duration_s 0.8 there, 0.8000000000001 here)" in imp(tmp_path, str(g)).stderr


@pytest.mark.parametrize(("name", "content", "says"), [
    ("rnd.json.gz", bytes(range(7, 200)), "named .gz but not gzip"),
    ("trace.json.bz2", b"BZh91AY&SY" + bytes(40), "bzip2-compressed, which import does not read"),
    ("trace.json.gz", b"BZh91AY&SY" + bytes(40), "bzip2-compressed"),
    ("trace.json.xz", b"\xfd7zXZ\x00" + bytes(40), "xz-compressed"),
    ("empty.json", b'{"traceEvents": []}', "no ProfilerStep#N spans (its traceEvents list is empty"),
    ("obj.json", b"{}", "JSON, but not a profiler trace (no traceEvents) nor a step table"),
])
def test_a_file_that_is_not_what_it_seems_is_said_for_what_it_is(tmp_path: Path, name: str, content: bytes,
                                                                  says: str) -> None:
    """A tester's random .gz and bzip2 stream were read as step tables ("not UTF-8 ... save the table as UTF-8"),
    an empty trace asked for --rank first, and `{}` was a table missing its time column."""
    f = tmp_path / name
    f.write_bytes(content)
    r = imp(tmp_path, str(f), "--job", "j", "--node", "n")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
