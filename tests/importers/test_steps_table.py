"""The plain per-rank step table (CSV / JSON lines): unknown phases stay unknown, errors name file and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from whywait.engine.importers import ImportFormatError
from whywait.engine.importers.steps_table import read_steps


def test_csv_rows_keep_event_time_and_leave_unknown_phases_out(tmp_path: Path) -> None:
    f = tmp_path / "steps.csv"
    f.write_text("time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s\n"
                 "2025-11-29T19:00:01Z,j,0,10,1.25,0.02,0.91,0.32\n"
                 "1764442802.5,j,1,10,1.30,,,\n")
    rows = list(read_steps(f, node="node-03"))
    assert rows[0] == ("j", "node-03", {"ended_at": 1_764_442_801.0, "rank": 0, "step": 10, "duration_s": 1.25,
                                        "data_wait_s": 0.02, "compute_s": 0.91, "comm_s": 0.32})
    assert rows[1][2] == {"ended_at": 1_764_442_802.5, "rank": 1, "step": 10, "duration_s": 1.3}


def test_jsonl_rows(tmp_path: Path) -> None:
    f = tmp_path / "steps.jsonl"
    f.write_text('{"time": 1764442801, "rank": 3, "step": 7, "duration_s": 45.0, "collective_s": 2.5, '
                 '"node": "n1"}\n\n')
    assert list(read_steps(f, job="long-steps")) == [
        ("long-steps", "n1", {"ended_at": 1_764_442_801.0, "rank": 3, "step": 7, "duration_s": 45.0,
                              "collective_s": 2.5})]


@pytest.mark.parametrize("text, says", [
    ("time,job,rank,step,duraton_s\n1,j,0,1,1\n", "steps.csv:1: unknown column(s) 'duraton_s' (did you mean "
                                                    "'duration_s'?)"),
    ("time,job,rank,step\n1,j,0,1\n", "steps.csv:1: no duration_s column (known names: duration_s: duration_s, "
                                       "duration, step_time, step_time_s)"),
    ("time,job,rank,step,duration_s\n1,j,0,1,-1\n", "steps.csv:2: duration_s: must be a finite number >= 0"),
    ("time,job,rank,step,duration_s\n1,j,0.5,1,1\n", "steps.csv:2: rank: must be a whole number"),
    ("time,job,rank,step,duration_s\n1,j,0,1,1\nnoon,j,0,2,1\n", "steps.csv:3: time: time must be Unix seconds"),
    ("time,job,rank,step,duration_s\n1,,0,1,1\n", "steps.csv:2: job: is required"),
])
def test_bad_rows_name_file_line_and_column(tmp_path: Path, text: str, says: str) -> None:
    f = tmp_path / "steps.csv"
    f.write_text(text)
    with pytest.raises(ImportFormatError) as e:
        list(read_steps(f, node="n"))
    assert says in str(e.value)


def test_a_header_that_is_not_one_is_a_short_line(tmp_path: Path) -> None:
    """A file that is not a step table (a JSON document, a long line of anything) is refused in a line of
    bounded length naming a few of its 'columns', not one holding the whole first line."""
    f = tmp_path / "steps.csv"
    f.write_text(",".join(f"col{i}-" + "x" * 200 for i in range(5000)) + "\n1\n")
    with pytest.raises(ImportFormatError) as e:
        list(read_steps(f, job="j", node="n"))
    msg = str(e.value)
    assert "steps.csv:1: no time, rank, step, duration_s columns" in msg and "other columns: col0-" in msg
    assert "and 4,995 more" in msg and len(msg) < 600
    f.write_text('[{"ph": "X"}]\n')
    with pytest.raises(ImportFormatError, match=r"steps.csv:1: a JSON array, not a step table"):
        list(read_steps(f, job="j", node="n"))


def test_other_tools_column_names_and_units_are_read(tmp_path: Path) -> None:
    """A table as a training loop's own logger writes it: its names, milliseconds, a host column."""
    f = tmp_path / "steps.csv"
    f.write_text("Timestamp,Global Rank,Iteration,Step Time (ms),data_wait_ms,Hostname\n"
                 "2025-11-29T19:00:01Z,3,120,1250,20,gpu-07\n"
                 "1764442802.5,4,120,1300.5,,gpu-08\n")
    rows = list(read_steps(f, job="llm"))
    assert rows[0] == ("llm", "gpu-07", {"ended_at": 1_764_442_801.0, "rank": 3, "step": 120,
                                         "duration_s": 1.25, "data_wait_s": pytest.approx(0.02)})
    assert rows[1] == ("llm", "gpu-08", {"ended_at": 1_764_442_802.5, "rank": 4, "step": 120,
                                         "duration_s": pytest.approx(1.3005)})
    # milliseconds since 1970 as the time, JSON lines with a key of their own (left out, as always)
    g = tmp_path / "steps.jsonl"
    g.write_text('{"time_ms": 1764442801250, "rank": 0, "iter": 7, "duration_ms": 45000, "loss": 2.1, '
                 '"host": "n1"}\n')
    assert list(read_steps(g, job="j")) == [
        ("j", "n1", {"ended_at": 1_764_442_801.25, "rank": 0, "step": 7, "duration_s": 45.0})]


@pytest.mark.parametrize("header, says", [
    ("time,rank,step,iteration,duration_s", "columns 'step' and 'iteration' are both step: keep one"),
    ("time,rank,step,duration_s,duration_ms", "columns 'duration_s' and 'duration_ms' are both duration_s"),
    ("time,local_rank,step,duration_s", "no rank column (known names: rank: rank, global_rank, rank_id, "
                                        "world_rank); other columns: local_rank"),  # not the global rank
])
def test_ambiguous_columns_are_refused_with_their_names(tmp_path: Path, header: str, says: str) -> None:
    f = tmp_path / "steps.csv"
    f.write_text(header + "\n" + ",".join("1" for _ in header.split(",")) + "\n")
    with pytest.raises(ImportFormatError) as e:
        list(read_steps(f, job="j", node="n"))
    assert f"steps.csv:1: {says}" in str(e.value)


def test_a_row_with_more_cells_than_the_header_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "steps.csv"
    f.write_text("time,rank,step,duration_s\n1,0,1,1.5,\n2,0,2,1.5,7\n")  # a trailing empty cell is harmless
    with pytest.raises(ImportFormatError, match=r"steps.csv:3: 5 cells, and the header names 4 columns"):
        list(read_steps(f, job="j", node="n"))


def test_a_loggers_other_columns_are_left_out_and_said_so_and_an_empty_table_is_refused(tmp_path: Path) -> None:
    from collections import Counter

    f = tmp_path / "steps.csv"
    f.write_text("timestamp,global_rank,iteration,step_time_ms,loss,lr,tokens_per_s,rank_ms\n"
                 "1764442801,0,1,1250,2.31,0.0003,51000,4\n")
    notes: Counter[str] = Counter()
    assert list(read_steps(f, job="j", node="n", notes=notes)) == [
        ("j", "n", {"ended_at": 1_764_442_801.0, "rank": 0, "step": 1, "duration_s": 1.25})]
    assert list(notes) == ["steps.csv: column(s) loss, lr, rank_ms, tokens_per_s hold no step timing: left out"]
    for text, says in (("", "steps.csv: no rows: the table is empty"),
                       ("time,rank,step,duration_s\n", "steps.csv: no rows: the table is empty but for its header")):
        f.write_text(text)
        with pytest.raises(ImportFormatError) as e:
            list(read_steps(f, job="j", node="n"))
        assert str(e.value).endswith(says), str(e.value)
