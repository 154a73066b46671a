"""`whywait import` as a new user met it: contract errors named a message number instead of the row, a cut
bundle read as a "not UTF-8" table, a trace cut mid-event was refused, duplicate rows went through silently,
and a ``;``-separated table had "no time, rank, step, duration_s columns"."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.kineto import steps_from_trace
from whywait.engine.importers.steps_table import read_step_rows, read_steps

REPO = Path(__file__).resolve().parents[2]
HTA = REPO / "tests" / "fixtures" / "importers" / "hta"
RANK0 = HTA / "sampled_rank-0.json.gz"
T0 = 1_796_400_000  # a step's end, in Unix seconds (2026-12-03)


def _imp(tmp_path: Path, *argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "whywait", "import", *map(str, argv),
                           "-o", str(tmp_path / "out.jsonl")], capture_output=True, text=True, cwd=REPO, timeout=120)


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    """The command's one-line error (exit 2, no traceback)."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _table(path: Path, rows: list[str], header: str = "time,rank,step,duration_s,compute_s") -> Path:
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return path


def _out(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]


# ---- 1. a value the contract refuses is said at its row ---------------------------------------------------------

def test_a_duration_over_the_contracts_bound_names_file_line_and_column(tmp_path: Path) -> None:
    rows = [f"{T0 + i},{i % 2},{i},{2e8 if i == 500 else 0.8},0.5" for i in range(800)]
    f = _table(tmp_path / "big.csv", rows)  # row i is on line i + 2: the bad one on line 502
    assert _one_line(_imp(tmp_path, f, "--job", "j", "--node", "n")) == \
        f"whywait import: {f}:502: column duration_s: 2e+08 s is outside 0..1e+08 s"


def test_a_phase_longer_than_its_step_names_its_line(tmp_path: Path) -> None:
    rows = [f"{T0 + i},{i % 2},{i},0.8,{5 if i == 698 else 0.5}" for i in range(800)]
    f = _table(tmp_path / "comp.csv", rows)
    assert _one_line(_imp(tmp_path, f, "--job", "j", "--node", "n")) == (
        f"whywait import: {f}:700: column compute_s: 5 s is longer than its step allows (duration_s 0.8 s: at most "
        "1.5 × duration_s + 1 s, 2.2 s here)")


def test_a_column_under_another_name_is_named_as_the_table_names_it(tmp_path: Path) -> None:
    f = _table(tmp_path / "s.csv", [f"{T0},0,1,2e11"], header="time,rank,step,Step Time (ms)")
    with pytest.raises(ImportFormatError, match=r"s.csv:2: column 'Step Time \(ms\)' \(duration_s\): 2e\+08 s is "
                                                r"outside 0..1e\+08 s"):
        list(read_steps(f, "j", "n"))


def test_a_name_the_contract_refuses_is_said_at_its_line_not_a_message_number(tmp_path: Path) -> None:
    f = _table(tmp_path / "s.csv", [f"{T0},0,1,0.8,", f"{T0 + 1},0,2,0.8,"])
    msg = _one_line(_imp(tmp_path, f, "--job", "j" * 300, "--node", "n"))
    assert msg.startswith(f"whywait import: {f}:2: job: must be at most 256 characters"), msg
    assert "message" not in msg


def test_a_millisecond_epoch_column_is_read_as_milliseconds_with_a_note(tmp_path: Path) -> None:
    f = _table(tmp_path / "ms.csv", [f"{(T0 + i) * 1000},0,{i},0.8," for i in range(3)])
    r = _imp(tmp_path, f, "--job", "j", "--node", "n")
    assert r.returncode == 0, r.stderr
    assert f"note: ms.csv: column time holds milliseconds since 1970 (line 2: '{T0 * 1000}'): read as " \
           "milliseconds; name the column time_ms to say so" in r.stdout
    assert [m["steps"][0]["ended_at"] for m in _out(tmp_path)] == [T0, T0 + 1, T0 + 2]


def test_microseconds_read_too_and_a_column_mixing_units_is_refused_naming_both_lines(tmp_path: Path) -> None:
    notes: Counter[str] = Counter()
    f = _table(tmp_path / "us.csv", [f"{T0 * 1_000_000},0,1,0.8,"])
    assert [r[2]["ended_at"] for r in read_steps(f, "j", "n", notes)] == [T0]
    assert any("holds microseconds since 1970" in n for n in notes)
    f = _table(tmp_path / "mixed.csv", [f"{T0},0,1,0.8,", f"{(T0 + 1) * 1000},0,2,0.8,"])
    assert _one_line(_imp(tmp_path, f, "--job", "j", "--node", "n")) == (
        f"whywait import: {f}:3: column time: '{(T0 + 1) * 1000}' looks like milliseconds since 1970, and line 2 "
        f"('{T0}') holds seconds: one unit for the whole column")
    f = _table(tmp_path / "mixed2.csv", [f"{T0 * 1000},0,1,0.8,", f"{T0 + 1},0,2,0.8,"])
    with pytest.raises(ImportFormatError, match=r"mixed2.csv:3: column time: '1796400001' reads as seconds, and "
                                                r"line 2 \('1796400000000'\) holds milliseconds"):
        list(read_steps(f, "j", "n"))


def test_a_time_column_that_names_its_unit_is_not_second_guessed(tmp_path: Path) -> None:
    f = _table(tmp_path / "t.csv", [f"{T0 * 1_000_000},0,1,0.8"], header="time_ms,rank,step,duration_s")
    with pytest.raises(ImportFormatError, match="t.csv:2: column time_ms \\(time\\): 1.7964e\\+12 s since 1970 in the "
                                                "unit the column names, over 1e\\+11 s"):
        list(read_steps(f, "j", "n"))
    f = _table(tmp_path / "neg.csv", [f"-{T0},0,1,0.8"], header="time,rank,step,duration_s")
    with pytest.raises(ImportFormatError, match="neg.csv:2: column time: '-1796400000' is outside 0..1e\\+11 s"):
        list(read_steps(f, "j", "n"))


def test_a_kineto_step_the_contract_refuses_names_the_step_event(tmp_path: Path) -> None:
    ts = T0 * 1_000_000
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": ts, "dur": 2e14}]
    f = tmp_path / "long.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    assert _one_line(_imp(tmp_path, f, "--job", "j", "--node", "n")) == (
        f"whywait import: {f}: ProfilerStep#3 (ts {ts} µs): duration_s: must be within 0..1e+08 s (got 200000000.0)")


# ---- 2. a file cut short ---------------------------------------------------------------------------------------

def _bundle(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:  # stored, so a cut keeps the first member's header
        z.writestr("manifest.json", "{}")
        z.writestr("events.jsonl", bytes(range(256)) * 400)
    return path


@pytest.mark.parametrize("name", ["t.whywait", "t.bin"])
def test_a_bundle_cut_short_is_said_to_be_one_not_a_table_that_is_not_utf8(tmp_path: Path, name: str) -> None:
    whole = _bundle(tmp_path / "inc.whywait").read_bytes()
    cut = tmp_path / name
    cut.write_bytes(whole[:50_000])
    msg = _one_line(_imp(tmp_path, cut))
    assert "truncated" in msg and "UTF-8" not in msg, msg


def test_a_zip_is_detected_as_a_bundle_whatever_the_bundle_reader_says(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from whywait.engine.commands import import_cmd
    from whywait.engine.importers import bundle

    cut = tmp_path / "t.bin"
    cut.write_bytes(_bundle(tmp_path / "inc.whywait").read_bytes()[:50_000])
    monkeypatch.setattr(bundle, "is_bundle", lambda path: False)
    assert import_cmd.detect(cut) == "bundle"
    assert import_cmd.detect(tmp_path / "inc.whywait") == "bundle"


def _trace_text() -> str:
    return gzip.decompress(RANK0.read_bytes()).decode()


def test_a_trace_cut_mid_event_is_read_up_to_the_cut_with_a_note(tmp_path: Path) -> None:
    text = _trace_text()
    whole = [s.record() for s in steps_from_trace(RANK0)]
    n_events = len(json.loads(text)["traceEvents"])
    for cut_at in (len(text) - 5, len(text) - 40, len(text) - 100):  # inside the last events, after the steps
        f = tmp_path / "rank-0.json"
        f.write_text(text[:cut_at])
        notes: Counter[str] = Counter()
        assert [s.record() for s in steps_from_trace(f, notes=notes)] == whole
        (note,) = [n for n in notes if "cut short" in n]
        assert f"read up to event {n_events - 1:,} (traceEvents[{n_events - 2}])" in note or \
            f"read up to event {n_events - 2:,}" in note, note
    r = _imp(tmp_path, f, "--job", "j", "--node", "n")
    assert r.returncode == 0, r.stderr
    assert "note: rank-0.json: the trace is cut short (the file ends inside an event" in r.stdout
    assert len(_out(tmp_path)) == len(whole)


def test_a_trace_cut_in_its_array_form_or_inside_a_character_is_read_too(tmp_path: Path) -> None:
    events = json.loads(_trace_text())["traceEvents"]
    text = json.dumps(events, ensure_ascii=False)
    whole = [s.record() for s in steps_from_trace(RANK0)]
    f = tmp_path / "rank-0.json"
    f.write_text(text[:-30])
    notes: Counter[str] = Counter()
    assert [s.record() for s in steps_from_trace(f, notes=notes)] == whole
    assert any("cut short" in n for n in notes)
    # a cut inside a multi-byte character: the bytes before it are read
    ev = events[:-1] + [{"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "é" * 20}}]
    raw = json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": ev}, ensure_ascii=False).encode()
    f.write_bytes(raw[:raw.index("é".encode()) + 1])
    assert [s.record() for s in steps_from_trace(f)] == whole


def test_a_gzipped_trace_cut_short_is_read_up_to_the_cut(tmp_path: Path) -> None:
    f = tmp_path / "rank-0.json.gz"
    f.write_bytes(RANK0.read_bytes()[:60_000])
    notes: Counter[str] = Counter()
    got = steps_from_trace(f, notes=notes)
    assert got and any("cut short (the gzip stream ends early" in n for n in notes)


def test_a_trace_cut_before_any_whole_event_or_step_says_truncated(tmp_path: Path) -> None:
    text = _trace_text()
    f = tmp_path / "rank-0.json"
    f.write_text(text[:30])
    msg = _one_line(_imp(tmp_path, "--format", "kineto", f, "--job", "j", "--node", "n"))
    assert msg.startswith(f"whywait import: {f}: not a JSON trace (") and "truncated?" in msg, msg
    f.write_text(text[:400])  # the first event whole, no step in it
    msg = _one_line(_imp(tmp_path, "--format", "kineto", f, "--job", "j", "--node", "n"))
    assert "no ProfilerStep#N spans in the 1 event before the trace was cut short: truncated?" in msg, msg


def test_a_trace_broken_before_its_end_is_not_taken_for_a_cut_one(tmp_path: Path) -> None:
    text = _trace_text()
    mid = text.index("}, {", len(text) // 2) + 3  # between two events, halfway
    f = tmp_path / "rank-0.json"
    f.write_text(text[:mid] + "@@" + text[mid:])
    with pytest.raises(ImportFormatError, match="not a JSON trace") as e:
        steps_from_trace(f)
    assert "truncated" not in str(e.value) and "cut" not in str(e.value)


# ---- 3. one row per rank per step ------------------------------------------------------------------------------

def test_an_exact_duplicate_row_is_dropped_with_a_note(tmp_path: Path) -> None:
    f = tmp_path / "d.csv"
    f.write_text(f"time,rank,step,duration_s\n{T0},0,1,0.8\n{T0},0,1,0.8\n{T0 + 1},0,2,0.8\n{T0},0,1,0.8\n")
    r = _imp(tmp_path, f, "--job", "j", "--node", "n")
    assert r.returncode == 0, r.stderr
    assert "note: d.csv: 2 rows repeated exactly (the same step of the same rank, every value equal): dropped" \
        in r.stdout
    assert "wrote 2 messages" in r.stdout
    assert [line for line, *_ in read_step_rows(f, "j", "n")] == [2, 4]


def test_two_different_rows_for_one_step_of_one_rank_are_refused_naming_both_lines(tmp_path: Path) -> None:
    f = tmp_path / "d.csv"
    f.write_text(f"time,rank,step,duration_s\n{T0},0,1,0.8\n{T0 + 1},1,1,0.8\n{T0},0,1,0.9\n")
    assert _one_line(_imp(tmp_path, f, "--job", "j", "--node", "n")) == (
        f"whywait import: {f}:4: job j rank 0 step 1 is also on line 2, with other values (duration_s 0.8 there, "
        "0.9 here): one row per rank per step")


def test_one_table_given_twice_is_refused_in_words_that_fit_a_table(tmp_path: Path) -> None:
    f = _table(tmp_path / "s.csv", [f"{T0},0,1,0.8,"])
    msg = _one_line(_imp(tmp_path, f, f, "--job", "j", "--node", "n"))
    assert msg == (f"whywait import: {f}:2: job j rank 0 step 1 is also in {f}:2: the same table twice, or two "
                   "tables that give one rank's steps; import each rank's steps once")
    assert "trace" not in msg


# ---- 4. other separators ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sep", [";", "\t", "|"])
def test_a_table_separated_otherwise_is_read(tmp_path: Path, sep: str) -> None:
    f = tmp_path / "s.csv"
    f.write_text(sep.join(["time", "rank", "step", "duration_s"]) + "\n" + sep.join([str(T0), "0", "1", "0.8"]) + "\n")
    r = _imp(tmp_path, f, "--job", "j", "--node", "n")
    assert r.returncode == 0, r.stderr
    assert _out(tmp_path)[0]["steps"] == [{"rank": 0, "step": 1, "duration_s": 0.8, "ended_at": T0}]
    assert (f"note: s.csv: cells separated by {sep!r}" in r.stdout) == (sep != "\t")


def test_a_semicolon_table_with_decimal_commas_is_refused_at_the_cell(tmp_path: Path) -> None:
    f = tmp_path / "s.csv"
    f.write_text(f"time;rank;step;duration_s\n{T0};0;1;0,8\n")
    assert _one_line(_imp(tmp_path, f, "--job", "j", "--node", "n")) == (
        f"whywait import: {f}:2: column duration_s: '0,8' has a decimal comma (the table is ';'-separated, as "
        "spreadsheets save it where the comma is the decimal mark): save it with decimal points")


def test_a_comma_inside_a_quoted_header_does_not_choose_the_separator(tmp_path: Path) -> None:
    f = tmp_path / "s.csv"
    f.write_text(f'time;rank;step;duration_s;"loss, smoothed"\n{T0};0;1;0.8;2\n')
    assert [r[2]["duration_s"] for r in read_steps(f, "j", "n")] == [0.8]
