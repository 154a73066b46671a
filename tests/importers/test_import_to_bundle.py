"""``whywait import TABLE -o NAME.whywait`` writes a bundle that ``whywait replay --input`` reads, no broker.

A tester with a step table and no Kafka found no way to a replay: ``-o`` wrote JSON lines, and ``--input``
takes a bundle only ("not a whywait bundle (not a zip archive ...)"), so they wrote their own converter.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from whywait.engine.cli import main

START = 1_764_928_800.0


def table(path: Path) -> None:
    """8 ranks, 120 steps; rank 5 computes 1.6x as long from step 40, the others wait for it in comm."""
    rng = random.Random(4)
    t, rows = START, ["time,job,rank,step,duration_s,data_wait_s,compute_s,comm_s,node"]
    for step in range(120):
        comp = {r: 0.6 * (1 + rng.gauss(0, 0.02)) * (1.6 if r == 5 and step >= 40 else 1.0) for r in range(8)}
        dur = max(comp.values()) + 0.15
        t += dur
        rows += [f"{t:.3f},bjob,{r},{step},{dur:.4f},0.01,{comp[r]:.4f},{dur - 0.01 - comp[r]:.4f},node-{r // 4}"
                 for r in range(8)]
    path.write_text("\n".join(rows) + "\n")


def test_a_table_imported_to_a_bundle_replays_with_no_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WHYWAIT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # nothing listens there: no broker is used
    table(tmp_path / "steps.csv")
    bundle = tmp_path / "steps.whywait"
    assert main(["import", str(tmp_path / "steps.csv"), "--project", "llm", "--team", "ml", "-o", str(bundle)]) == 0
    assert "replay it with: whywait replay --input" in capsys.readouterr().out
    assert main(["replay", "--input", str(bundle), "--report", str(tmp_path / "pm")]) == 0
    out = capsys.readouterr().out
    assert "1 incident(s)" in out and "job.straggler" in out and "Rank 5 on node-1" in out, out
    assert (tmp_path / "pm" / "report.html").exists()


def test_json_lines_given_as_a_bundle_say_how_to_make_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    table(tmp_path / "steps.csv")
    lines = tmp_path / "steps.jsonl"
    assert main(["import", str(tmp_path / "steps.csv"), "--project", "llm", "--team", "ml", "-o", str(lines)]) == 0
    capsys.readouterr()
    assert main(["replay", "--input", str(lines)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is JSON lines, not a bundle" in err and "-o NAME.whywait" in err
    bundle = tmp_path / "b.whywait"
    assert main(["import", str(tmp_path / "steps.csv"), "-o", str(bundle)]) == 0
    capsys.readouterr()
    assert main(["import", str(bundle), "-o", str(tmp_path / "again.whywait")]) == 2
    assert "is a bundle already" in capsys.readouterr().err


def test_an_existing_bundle_is_never_overwritten_and_a_table_given_as_one_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An import named an exported incident's bundle by mistake and replaced it (rc 0, no word); and
    ``replay --input steps.csv`` said only "not a zip archive"."""
    table(tmp_path / "steps.csv")
    bundle = tmp_path / "incident.whywait"
    bundle.write_bytes(b"PK\x03\x04 an exported incident")
    assert main(["import", str(tmp_path / "steps.csv"), "-o", str(bundle)]) == 2
    assert "incident.whywait exists: remove it or name another bundle" in capsys.readouterr().err
    assert bundle.read_bytes() == b"PK\x03\x04 an exported incident"
    assert main(["replay", "--input", str(tmp_path / "steps.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a table, not a bundle" in err and "-o NAME.whywait" in err
