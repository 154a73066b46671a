"""Damaged real inputs to the Slurm hook and the ownership file: a one-line error or a placement, never a crash.

The inputs are the real ``scontrol show job --json`` captures and the ownership file in
tests/fixtures/placement (see ATTRIBUTION.md there), cut short, given stray non-UTF-8 bytes, with
values of the wrong type or null.  What the hook must never do is report an internal error (exit 70):
a prolog that fails that way tells the operator nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from whywait.engine.cli import main

from tests.placement.conftest import FIX
from tests.support.hostile import retyped
from whywait.errors import EXIT_INTERNAL


def _damaged(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Deterministic damage: truncations, quotes dropped, wrong types and nulls on every few lines, a stray byte."""
    lines = data.split(b"\n")
    every = max(1, len(lines) // 30)
    for i in range(0, len(lines), every):
        yield f"cut at line {i}", b"\n".join(lines[:i])
        for label, old, new in (("unquoted", b'"', b""), ("a number", b': "', b': 12345, "x": "'),
                                ("null", b": ", b': null, "y": ')):
            changed = list(lines)
            changed[i] = changed[i].replace(old, new, 2)
            yield f"{label} on line {i}", b"\n".join(changed)
    yield "a non-UTF-8 byte", data[: len(data) // 2] + b"\xff" + data[len(data) // 2:]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("capture", "job"), [("scontrol-show-job-23.02.json", "4242"),
                                              ("scontrol-show-job-24.05.json", "4314")])
def test_a_damaged_scontrol_capture_is_one_line(capture: str, job: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "scontrol.json"
    failures = []
    for what, data in _damaged((FIX / capture).read_bytes()):
        bad.write_bytes(data)
        rc, err = _run(["placement", "slurm", "--prolog", "--strict", "--job-id", job, "--scontrol-json", str(bad),
                        "--ownership", str(FIX / "ownership.yaml"), "--print"], capsys)
        if rc == EXIT_INTERNAL or "Traceback" in err or "internal error" in err:
            failures.append(f"{what}: rc {rc}: {err.strip()[-200:]}")
    assert failures == []


def test_a_damaged_ownership_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "ownership.yaml"
    failures = []
    for what, data in _damaged((FIX / "ownership.yaml").read_bytes()):
        bad.write_bytes(data)
        rc, err = _run(["placement", "slurm", "--prolog", "--strict", "--job-id", "4242", "--scontrol-json",
                        str(FIX / "scontrol-show-job-23.02.json"), "--ownership", str(bad), "--print"], capsys)
        if rc == EXIT_INTERNAL or "Traceback" in err or "internal error" in err:
            failures.append(f"{what}: rc {rc}: {err.strip()[-200:]}")
    assert failures == []


def test_non_utf8_names_the_file_and_byte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "placements.yaml"
    bad.write_bytes(b"jobs:\n  - job: caf\xe9\n")
    rc, err = _run(["placement", "publish", str(bad), "--print"], capsys)
    assert rc == 2
    assert err.strip().splitlines()[-1].endswith(f"{bad}: cannot read: not UTF-8 text (byte 18)")


@pytest.mark.parametrize("capture", ["scontrol-show-job-23.02.json", "scontrol-show-job-24.05.json"])
def test_every_field_of_a_real_scontrol_job_of_another_type(capture: str) -> None:
    """A job that is not an object, a count where a list belongs: a PlacementError, never an AttributeError."""
    import json

    from whywait.engine.placement.model import PlacementError
    from whywait.engine.placement.slurm import facts_from_scontrol

    doc = json.loads((FIX / capture).read_text())
    job = str(doc["jobs"][0]["job_id"])

    failures = []
    for what, damaged in retyped(doc, (None, "x", -1, [], {}, True, 10**30, 1e308)):
        try:
            facts_from_scontrol(json.dumps(damaged), job, {"SLURM_JOB_ID": job})
        except PlacementError:
            pass
        except Exception as exc:  # noqa: BLE001 - any other escape is the defect looked for
            failures.append(f"{what}: {type(exc).__name__}: {exc}")
    assert failures == []
